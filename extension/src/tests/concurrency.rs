//! Per-key concurrency (`sql/concurrency.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

    /// Per concurrency key of queue `c`: (admitted pending, leased, held).
    fn slots(key: &str) -> (i64, i64, i64) {
        let row = Spi::get_three::<i64, i64, i64>(&format!(
            "SELECT count(*) FILTER (WHERE state = 'pending' AND NOT held),
                    count(*) FILTER (WHERE state = 'leased'),
                    count(*) FILTER (WHERE state = 'pending' AND held)
               FROM lease.job WHERE queue = 'c' AND concurrency_key = '{key}'"
        ))
        .expect("slots");
        (row.0.unwrap_or(0), row.1.unwrap_or(0), row.2.unwrap_or(0))
    }

    /// The bookkeeping agrees with the rows: `active` = admitted pending +
    /// leased, `waiting` = held, for every key.
    fn slots_agree() -> bool {
        check(
            "SELECT NOT EXISTS (
                 SELECT FROM (SELECT concurrency_key AS key,
                                     count(*) FILTER (WHERE state IN ('pending', 'leased') AND NOT held) AS active,
                                     count(*) FILTER (WHERE state = 'pending' AND held) AS waiting
                                FROM lease.job WHERE queue = 'c' AND concurrency_key IS NOT NULL
                               GROUP BY 1) r
                 FULL JOIN (SELECT key, active, waiting FROM lease.key_slot WHERE queue = 'c') s USING (key)
                WHERE coalesce(r.active, 0) <> coalesce(s.active, 0)
                   OR coalesce(r.waiting, 0) <> coalesce(s.waiting, 0))",
        )
    }

    #[pg_test]
    fn a_concurrency_key_admits_at_most_k_rows_and_frees_on_every_end() {
        run("SELECT lease.create_queue('c', concurrency => 2, backoff_base => '0', backoff_max => '0',
                                       max_attempts => 2)");
        run("SELECT lease.enqueue('c', jsonb_build_object('i', i), concurrency_key => 'a', priority => i % 2)
               FROM generate_series(1, 6) i");
        run("SELECT lease.enqueue('c', '{}', concurrency_key => 'b')");
        assert_eq!(slots("a"), (2, 0, 4));
        assert_eq!(slots("b"), (1, 0, 0));
        // A claim sees only admitted rows, whatever its limit.
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(100, '1 minute', 'w', 'c')"),
            3
        );
        assert_eq!(slots("a"), (0, 2, 4));
        assert!(slots_agree());
        // done frees a slot: the next row is the highest priority, then oldest.
        let id =
            int("SELECT min(id) FROM lease.job WHERE state = 'leased' AND concurrency_key = 'a'");
        let epoch = int(&format!("SELECT epoch FROM lease.job WHERE id = {id}"));
        assert!(check(&format!("SELECT lease.release({id}, 'w', {epoch})")));
        assert_eq!(slots("a"), (1, 1, 3));
        assert!(check(
            "SELECT payload->>'i' = '3' FROM lease.job
              WHERE concurrency_key = 'a' AND state = 'pending' AND NOT held"
        ));
        // A retry keeps its slot: nothing is admitted.
        run(
            "SELECT lease.release(id, 'w', epoch, 'retry') FROM lease.job
              WHERE state = 'leased' AND concurrency_key = 'a'",
        );
        assert_eq!(slots("a"), (2, 0, 3));
        assert!(slots_agree());
        // fail (dead) and cancel of an admitted row free theirs; a held
        // row's cancel takes it out of the line.
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(100, '1 minute', 'w', 'c')"),
            2
        );
        run("SELECT lease.release_batch(array_agg(id), 'w', array_agg(epoch), 'fail') FROM lease.job
              WHERE state = 'leased' AND concurrency_key = 'a'");
        assert_eq!(slots("a"), (2, 0, 1));
        run("SELECT lease.cancel(max(id)) FROM lease.job WHERE concurrency_key = 'a' AND held");
        assert_eq!(slots("a"), (2, 0, 0));
        run("SELECT lease.cancel(min(id)) FROM lease.job
              WHERE concurrency_key = 'a' AND state = 'pending'");
        assert_eq!(slots("a"), (1, 0, 0));
        assert!(slots_agree());
        // A requeued dead letter gets back in line for a slot.
        run("SELECT lease.enqueue('c', '{}', concurrency_key => 'a')");
        assert_eq!(slots("a"), (2, 0, 0));
        run("SELECT lease.requeue(min(id)) FROM lease.job WHERE state = 'dead'");
        assert_eq!(slots("a"), (2, 0, 1));
        // Raising the limit admits at once; removing it admits everything.
        run("SELECT lease.create_queue('c', concurrency => 3)");
        assert_eq!(slots("a"), (3, 0, 0));
        assert!(slots_agree());
        // Empty bookkeeping rows go with the next sweep.
        run("SELECT lease.release(id, 'w', epoch) FROM lease.job WHERE concurrency_key = 'b'");
        run("SELECT lease.sweep()");
        assert_eq!(
            int("SELECT count(*) FROM lease.key_slot WHERE key = 'b'"),
            0
        );
        assert!(slots_agree());
    }

    #[pg_test]
    fn expiry_keeps_the_slot_and_the_end_of_the_last_attempt_frees_it() {
        run("SELECT lease.create_queue('c', concurrency => 1, backoff_base => '0', backoff_max => '0',
                                       max_attempts => 2)");
        run("SELECT lease.enqueue('c', '{}', concurrency_key => 'a') FROM generate_series(1, 2)");
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(10, '10 milliseconds', 'w', 'c')"),
            1
        );
        run("SELECT pg_sleep(0.05)");
        run("SELECT lease._reap(100, 'c')");
        assert_eq!(slots("a"), (1, 0, 1));
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(10, '10 milliseconds', 'w', 'c')"),
            1
        );
        run("SELECT pg_sleep(0.05)");
        // Attempts spent: the expiry dead-letters it, and the next row is in.
        run("SELECT lease._reap(100, 'c')");
        assert_eq!(
            int("SELECT count(*) FROM lease.job WHERE state = 'dead'"),
            1
        );
        assert_eq!(slots("a"), (1, 0, 0));
        assert!(slots_agree());
    }

    #[pg_test]
    fn enqueue_batch_holds_rows_beyond_each_keys_limit() {
        run("SELECT lease.create_queue('c', concurrency => 1)");
        run(
            "SELECT lease.enqueue_batch('c', array_fill('{}'::jsonb, ARRAY[5]),
                                        keys => ARRAY['k1', 'k1', NULL, NULL, NULL],
                                        concurrency_keys => ARRAY['a', 'b', 'a', 'a', NULL])",
        );
        // The repeated key inserted one row; 'a' got one slot, 'b' one.
        assert_eq!(slots("a"), (1, 0, 2));
        assert_eq!(slots("b"), (0, 0, 0));
        assert_eq!(
            int("SELECT count(*) FROM lease.job WHERE concurrency_key IS NULL"),
            1
        );
        assert!(slots_agree());
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'w', 'c')"),
            2
        );
        // lease.metrics counts held rows apart from ready ones.
        assert!(check(
            "SELECT ready = 0 AND leased = 2 AND held = 2 FROM lease.metrics WHERE queue = 'c'"
        ));
    }

    #[pg_test]
    fn concurrency_keys_reject_bad_input_and_change_nothing() {
        run("SELECT lease.create_queue('c', concurrency => 1)");
        for (sql, code) in [
            (
                "SELECT lease.enqueue('default', '{}', concurrency_key => 'a')",
                "22023",
            ),
            ("SELECT lease.enqueue('c', '{}', concurrency_key => '')", "22023"),
            (
                "SELECT lease.enqueue('c', '{}', concurrency_key => repeat('x', 257))",
                "22023",
            ),
            (
                "SELECT lease.enqueue_batch('c', ARRAY['{}', '{}']::jsonb[], concurrency_keys => ARRAY['a'])",
                "22023",
            ),
            (
                "SELECT lease.enqueue_batch('default', ARRAY['{}']::jsonb[], concurrency_keys => ARRAY['a'])",
                "22023",
            ),
            ("SELECT lease.create_queue('c', concurrency => 0)", "22023"),
            ("SELECT lease.create_queue('c', concurrency => 100001)", "22023"),
        ] {
            assert_eq!(sqlstate(sql), code, "{sql}");
        }
        assert_eq!(int("SELECT count(*) FROM lease.job"), 0);
        assert_eq!(int("SELECT count(*) FROM lease.key_slot"), 0);
        assert!(check(
            "SELECT concurrency = 1 FROM lease.queue WHERE name = 'c'"
        ));
    }

    /// Failed before recount rebuilt the slots: it left a corrupted count
    /// as it was, and the held row waited behind a slot nobody held.
    #[pg_test]
    fn recount_rebuilds_the_concurrency_slots() {
        run("SELECT lease.create_queue('c', concurrency => 1)");
        run("SELECT lease.enqueue('c', '{}', concurrency_key => 'a') FROM generate_series(1, 2)");
        // A row edited behind the functions' back: the admitted one is gone.
        run("DELETE FROM lease.job WHERE NOT held");
        assert_eq!(slots("a"), (0, 0, 1));
        assert!(!slots_agree());
        run("SELECT lease.recount()");
        assert_eq!(slots("a"), (1, 0, 0), "the held row is admitted");
        assert!(slots_agree());
    }
}
