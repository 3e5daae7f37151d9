//! `#[pg_test]`s: the semantics and the error cases of every SQL function.
//! Each test runs inside one transaction that is rolled back afterwards, so
//! the tests drive the database clock forward with `pg_sleep` and never see
//! the background workers.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// Runs statements, failing the test on any error.
    fn run(sql: &str) {
        Spi::run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Evaluates a boolean SQL expression (a whole SELECT).
    fn check(sql: &str) -> bool {
        Spi::get_one::<bool>(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .unwrap_or_else(|| panic!("{sql}: NULL"))
    }

    fn int(sql: &str) -> i64 {
        Spi::get_one::<i64>(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .unwrap_or_else(|| panic!("{sql}: NULL"))
    }

    fn text(sql: &str) -> Option<String> {
        Spi::get_one::<String>(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The SQLSTATE that `sql` fails with ('00000' if it succeeds). The
    /// statement runs in a subtransaction that is rolled back either way.
    fn sqlstate(sql: &str) -> String {
        if !check("SELECT to_regprocedure('pg_temp.sqlstate_of(text)') IS NOT NULL") {
            run("CREATE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text
                 LANGUAGE plpgsql AS $$
                 BEGIN EXECUTE q; RETURN '00000';
                 EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $$");
        }
        let quoted = sql.replace('\'', "''");
        text(&format!("SELECT pg_temp.sqlstate_of('{quoted}')")).expect("a SQLSTATE")
    }

    /// Claims one row of `queue` for `owner` and returns `(id, epoch)`.
    fn claim_one(owner: &str, ttl: &str, queue: &str) -> (i64, i64) {
        let row = Spi::get_two::<i64, i64>(&format!(
            "SELECT id, epoch FROM lease.claim_pending(1, '{ttl}', '{owner}', '{queue}')"
        ))
        .expect("claim");
        (row.0.expect("a claimed row"), row.1.expect("an epoch"))
    }

    // ---- queues -------------------------------------------------------------

    #[pg_test]
    fn default_queue_exists_and_create_queue_reconfigures() {
        assert_eq!(
            int("SELECT count(*) FROM lease.queue WHERE name = 'default'"),
            1
        );
        run("SELECT lease.create_queue('q', max_attempts => 3, retention => '1 hour')");
        run("SELECT lease.create_queue('q', max_attempts => 5)");
        assert!(check(
            "SELECT max_attempts = 5 AND retention = '0' FROM lease.queue WHERE name = 'q'"
        ));
    }

    #[pg_test]
    fn create_queue_rejects_bad_options() {
        assert_eq!(sqlstate("SELECT lease.create_queue(NULL)"), "22004");
        assert_eq!(sqlstate("SELECT lease.create_queue('')"), "22023");
        assert_eq!(
            sqlstate(&format!("SELECT lease.create_queue('{}')", "x".repeat(129))),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT lease.create_queue('q', max_attempts => 0)"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT lease.create_queue('q', backoff_base => '1 hour', backoff_max => '1 second')"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT lease.create_queue('q', retention => '-1 second')"),
            "22023"
        );
        assert_eq!(int("SELECT count(*) FROM lease.queue WHERE name = 'q'"), 0);
    }

    #[pg_test]
    fn drop_queue_refuses_unfinished_work_unless_forced() {
        run("SELECT lease.create_queue('q')");
        run("SELECT lease.enqueue('q', '{}')");
        assert_eq!(sqlstate("SELECT lease.drop_queue('q')"), "55006");
        assert_eq!(int("SELECT count(*) FROM lease.job WHERE queue = 'q'"), 1);
        assert_eq!(int("SELECT lease.drop_queue('q', force => true)"), 1);
        assert_eq!(int("SELECT count(*) FROM lease.queue WHERE name = 'q'"), 0);
        assert_eq!(sqlstate("SELECT lease.drop_queue('q')"), "42704");
        assert_eq!(sqlstate("SELECT lease.drop_queue(NULL)"), "22004");
    }

    // ---- enqueue ------------------------------------------------------------

    #[pg_test]
    fn enqueue_is_idempotent_on_queue_and_key() {
        let a = int("SELECT lease.enqueue('default', '{\"n\": 1}', key => 'k')");
        let b = int("SELECT lease.enqueue('default', '{\"n\": 2}', key => 'k')");
        assert_eq!(a, b);
        assert!(check(&format!(
            "SELECT payload = '{{\"n\": 1}}' FROM lease.job WHERE id = {a}"
        )));
        let c = int("SELECT lease.enqueue('default', '{\"n\": 3}')");
        assert_ne!(a, c);
        assert!(check(&format!(
            "SELECT state = 'pending' AND next_at <= clock_timestamp() AND attempt = 0 AND epoch = 0
               FROM lease.job WHERE id = {c}"
        )));
    }

    #[pg_test]
    fn enqueue_batch_returns_ids_in_input_order() {
        let old = int("SELECT lease.enqueue('default', '{}', key => 'old')");
        run("CREATE TEMP TABLE got AS
             SELECT id, ord FROM lease.enqueue_batch('default',
                 ARRAY['{\"i\":1}', '{\"i\":2}', '{\"i\":3}', '{\"i\":4}']::jsonb[],
                 ARRAY[NULL, 'old', 'x', 'x']) WITH ORDINALITY AS g(id, ord)");
        assert_eq!(int("SELECT count(*) FROM got"), 4);
        assert_eq!(int("SELECT id FROM got WHERE ord = 2"), old);
        assert!(check(
            "SELECT (SELECT id FROM got WHERE ord = 3) = (SELECT id FROM got WHERE ord = 4)"
        ));
        assert!(check(
            "SELECT payload = '{\"i\":1}' FROM lease.job WHERE id = (SELECT id FROM got WHERE ord = 1)"
        ));
        assert!(check(
            "SELECT payload = '{\"i\":3}' FROM lease.job WHERE id = (SELECT id FROM got WHERE ord = 3)"
        ));
        // Old row + two new rows: the duplicate key inserted nothing.
        assert_eq!(int("SELECT count(*) FROM lease.job"), 3);
    }

    #[pg_test]
    fn enqueue_rejects_bad_input_without_side_effects() {
        assert_eq!(sqlstate("SELECT lease.enqueue('nope', '{}')"), "42704");
        assert_eq!(sqlstate("SELECT lease.enqueue(NULL, '{}')"), "22004");
        assert_eq!(sqlstate("SELECT lease.enqueue('default', NULL)"), "22004");
        assert_eq!(
            sqlstate("SELECT lease.enqueue('default', '{oops')"),
            "22P02"
        );
        assert_eq!(
            sqlstate(
                "SELECT lease.enqueue_batch('default', ARRAY['{}','{}']::jsonb[], ARRAY['a'])"
            ),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT lease.enqueue_batch('default', ARRAY['{}', NULL]::jsonb[])"),
            "22004"
        );
        assert_eq!(
            sqlstate("SELECT lease.enqueue_batch('nope', ARRAY['{}']::jsonb[])"),
            "42704"
        );
        assert_eq!(int("SELECT count(*) FROM lease.job"), 0);
    }

    // ---- claim --------------------------------------------------------------

    #[pg_test]
    fn claim_orders_by_priority_then_eligibility_then_id() {
        let low = int("SELECT lease.enqueue('default', '{}', run_at => now() - interval '1 hour')");
        let high = int("SELECT lease.enqueue('default', '{}', priority => 5)");
        let older =
            int("SELECT lease.enqueue('default', '{}', run_at => now() - interval '2 hours')");
        run("SELECT lease.enqueue('default', '{}', run_at => now() + interval '1 hour')");
        let got: Vec<i64> = Spi::connect(|c| {
            c.select(
                "SELECT id FROM lease.claim_pending(10, '1 minute', 'w') ORDER BY id",
                None,
                &[],
            )
            .expect("claim")
            .map(|r| r.get::<i64>(1).expect("id").expect("not null"))
            .collect()
        });
        let mut want = vec![low, high, older];
        want.sort();
        assert_eq!(got, want, "the future row is not claimable yet");

        run(
            "SELECT lease.release(id, 'w', epoch, 'abandon') FROM lease.job WHERE state = 'leased'",
        );
        assert_eq!(
            int("SELECT id FROM lease.claim_pending(1, '1 minute', 'w')"),
            high
        );
        assert_eq!(
            int("SELECT id FROM lease.claim_pending(1, '1 minute', 'w')"),
            older
        );
        assert_eq!(
            int("SELECT id FROM lease.claim_pending(1, '1 minute', 'w')"),
            low
        );
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(1, '1 minute', 'w')"),
            0
        );
    }

    #[pg_test]
    fn claim_leases_at_most_limit_rows_with_fresh_epochs() {
        run("SELECT lease.enqueue_batch('default', array_fill('{}'::jsonb, ARRAY[5]))");
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(3, '30 seconds', 'a')"),
            3
        );
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(3, '30 seconds', 'b')"),
            2
        );
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(3, '30 seconds', 'c')"),
            0
        );
        assert!(check(
            "SELECT bool_and(state = 'leased' AND epoch = lease.epoch_floor() AND attempt = 1
                             AND lease_until > clock_timestamp() + interval '29 seconds'
                             AND lease_until <= clock_timestamp() + interval '30 seconds')
               FROM lease.job"
        ));
        assert_eq!(int("SELECT count(DISTINCT owner) FROM lease.job"), 2);
    }

    #[pg_test]
    fn claim_rejects_bad_input() {
        let bad = [
            ("SELECT lease.claim_pending(0, '1 minute', 'w')", "22023"),
            (
                "SELECT lease.claim_pending(10001, '1 minute', 'w')",
                "22023",
            ),
            ("SELECT lease.claim_pending(NULL, '1 minute', 'w')", "22004"),
            ("SELECT lease.claim_pending(1, '0 seconds', 'w')", "22023"),
            ("SELECT lease.claim_pending(1, '-1 second', 'w')", "22023"),
            ("SELECT lease.claim_pending(1, '2 days', 'w')", "22023"),
            ("SELECT lease.claim_pending(1, NULL, 'w')", "22004"),
            ("SELECT lease.claim_pending(1, '1 minute', '')", "22023"),
            ("SELECT lease.claim_pending(1, '1 minute', NULL)", "22004"),
            (
                "SELECT lease.claim_pending(1, '1 minute', 'w', NULL)",
                "22004",
            ),
            (
                "SELECT lease.claim_pending(1, '1 minute', 'w', 'nope')",
                "42704",
            ),
            ("SELECT lease.claim_pending(1, 'soon', 'w')", "22007"),
        ];
        run("SELECT lease.enqueue('default', '{}')");
        for (sql, state) in bad {
            assert_eq!(sqlstate(sql), state, "{sql}");
        }
        let long_owner = "o".repeat(257);
        assert_eq!(
            sqlstate(&format!(
                "SELECT lease.claim_pending(1, '1 minute', '{long_owner}')"
            )),
            "22023"
        );
        assert_eq!(
            int("SELECT count(*) FROM lease.job WHERE state = 'pending'"),
            1
        );
    }

    // ---- renew --------------------------------------------------------------

    #[pg_test]
    fn renew_extends_only_the_current_lease() {
        run("SELECT lease.enqueue('default', '{}')");
        let (id, epoch) = claim_one("a", "1 second", "default");
        assert!(check(&format!(
            "SELECT held AND lease_until > clock_timestamp() + interval '50 seconds' AND NOT cancel_requested
               FROM lease.renew({id}, 'a', {epoch}, '1 minute')"
        )));
        for (owner, e) in [("b", epoch), ("a", epoch + 1), ("a", epoch - 1)] {
            assert!(check(&format!(
                "SELECT NOT held AND lease_until IS NULL FROM lease.renew({id}, '{owner}', {e}, '1 hour')"
            )));
        }
        assert!(check(&format!(
            "SELECT lease_until < clock_timestamp() + interval '2 minutes' FROM lease.job WHERE id = {id}"
        )));
    }

    #[pg_test]
    fn renew_after_expiry_is_lost_even_before_reap() {
        run("SELECT lease.enqueue('default', '{}')");
        let (id, epoch) = claim_one("a", "50 milliseconds", "default");
        run("SELECT pg_sleep(0.1)");
        assert!(check(&format!(
            "SELECT NOT held FROM lease.renew({id}, 'a', {epoch}, '1 minute')"
        )));
        assert!(check(&format!(
            "SELECT lease_until < clock_timestamp() FROM lease.job WHERE id = {id}"
        )));
    }

    #[pg_test]
    fn renew_batch_reports_each_lease_in_order() {
        run("SELECT lease.enqueue_batch('default', array_fill('{}'::jsonb, ARRAY[2]))");
        let (a, ea) = claim_one("w", "1 minute", "default");
        let (b, eb) = claim_one("w", "1 minute", "default");
        run(&format!("SELECT lease.cancel({b})"));
        let held: Vec<(i64, bool, bool)> = Spi::connect(|c| {
            c.select(
                &format!(
                    "SELECT id, held, coalesce(cancel_requested, false)
                       FROM lease.renew_batch(ARRAY[{b}, 999999, {a}], 'w', ARRAY[{eb}, 1, {ea}], '2 minutes')"
                ),
                None,
                &[],
            )
            .expect("renew_batch")
            .map(|r| {
                (
                    r.get::<i64>(1).expect("id").expect("id"),
                    r.get::<bool>(2).expect("held").expect("held"),
                    r.get::<bool>(3).expect("cancel").expect("cancel"),
                )
            })
            .collect()
        });
        assert_eq!(
            held,
            vec![(b, true, true), (999999, false, false), (a, true, false)]
        );
        assert_eq!(
            sqlstate(&format!(
                "SELECT lease.renew_batch(ARRAY[{a}], 'w', ARRAY[1, 2], '1 minute')"
            )),
            "22023"
        );
        assert_eq!(
            sqlstate(&format!(
                "SELECT lease.renew_batch(ARRAY[{a}, NULL], 'w', ARRAY[1, 2], '1 minute')"
            )),
            "22004"
        );
        assert_eq!(
            sqlstate("SELECT lease.renew(NULL, 'w', 1, '1 minute')"),
            "22004"
        );
        assert_eq!(
            sqlstate("SELECT lease.renew(1, 'w', NULL, '1 minute')"),
            "22004"
        );
    }

    // ---- release ------------------------------------------------------------

    #[pg_test]
    fn release_done_deletes_or_keeps_by_retention() {
        run("SELECT lease.create_queue('kept', retention => '1 hour')");
        run("SELECT lease.enqueue('default', '{}'), lease.enqueue('kept', '{}')");
        let (gone, e1) = claim_one("w", "1 minute", "default");
        let (kept, e2) = claim_one("w", "1 minute", "kept");
        assert!(check(&format!("SELECT lease.release({gone}, 'w', {e1})")));
        assert!(check(&format!(
            "SELECT lease.release({kept}, 'w', {e2}, 'done')"
        )));
        assert_eq!(
            int(&format!("SELECT count(*) FROM lease.job WHERE id = {gone}")),
            0
        );
        assert!(check(&format!(
            "SELECT state = 'done' AND finished_at IS NOT NULL AND lease_until IS NULL
               FROM lease.job WHERE id = {kept}"
        )));
        // A second release of the same lease is refused.
        assert!(!check(&format!(
            "SELECT lease.release({kept}, 'w', {e2}, 'done')"
        )));
    }

    #[pg_test]
    fn release_by_a_stale_or_foreign_owner_changes_nothing() {
        run("SELECT lease.enqueue('default', '{}')");
        let (id, epoch) = claim_one("a", "1 minute", "default");
        for (owner, e) in [("b", epoch), ("a", epoch + 1), ("a", epoch - 1)] {
            for outcome in ["done", "retry", "fail", "abandon"] {
                assert!(!check(&format!(
                    "SELECT lease.release({id}, '{owner}', {e}, '{outcome}')"
                )));
            }
        }
        assert!(check(&format!(
            "SELECT state = 'leased' AND owner = 'a' AND epoch = {epoch} FROM lease.job WHERE id = {id}"
        )));
        assert_eq!(
            sqlstate(&format!(
                "SELECT lease.release({id}, 'a', {epoch}, 'maybe')"
            )),
            "22023"
        );
        assert_eq!(
            sqlstate(&format!("SELECT lease.release({id}, 'a', {epoch}, NULL)")),
            "22004"
        );
        assert_eq!(
            sqlstate(&format!("SELECT lease.release({id}, NULL, {epoch})")),
            "22004"
        );
    }

    #[pg_test]
    fn retry_applies_backoff_and_dead_letters_at_max_attempts() {
        run("SELECT lease.create_queue('q', max_attempts => 2, backoff_base => '10 seconds', backoff_max => '15 seconds', jitter => 'none')");
        let id = int("SELECT lease.enqueue('q', '{}')");
        let (_, e1) = claim_one("w", "1 minute", "q");
        assert!(check(&format!(
            "SELECT lease.release({id}, 'w', {e1}, 'retry', error => 'boom')"
        )));
        assert!(check(&format!(
            "SELECT state = 'pending' AND attempt = 1 AND last_error = 'boom'
                    AND next_at BETWEEN clock_timestamp() + interval '9 seconds' AND clock_timestamp() + interval '10 seconds'
               FROM lease.job WHERE id = {id}"
        )));
        // Not claimable during its backoff; an explicit retry_at overrides it.
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(1, '1 minute', 'w', 'q')"),
            0
        );
        run(&format!(
            "UPDATE lease.job SET next_at = clock_timestamp() WHERE id = {id}"
        ));
        let (_, e2) = claim_one("w", "1 minute", "q");
        assert!(e2 > e1);
        assert!(check(&format!(
            "SELECT lease.release({id}, 'w', {e2}, 'retry')"
        )));
        assert!(check(&format!(
            "SELECT state = 'dead' AND attempt = 2 AND last_error = 'boom' FROM lease.job WHERE id = {id}"
        )));
        assert_eq!(int("SELECT count(*) FROM lease.dead_letters"), 1);
    }

    #[pg_test]
    fn retry_at_and_backoff_cap() {
        run("SELECT lease.create_queue('q', backoff_base => '10 seconds', backoff_max => '15 seconds', jitter => 'none')");
        let id = int("SELECT lease.enqueue('q', '{}')");
        run(&format!("UPDATE lease.job SET attempt = 4 WHERE id = {id}"));
        let (_, e) = claim_one("w", "1 minute", "q");
        assert!(check(&format!(
            "SELECT lease.release({id}, 'w', {e}, 'retry')"
        )));
        assert!(check(&format!(
            "SELECT next_at BETWEEN clock_timestamp() + interval '14 seconds' AND clock_timestamp() + interval '15 seconds'
               FROM lease.job WHERE id = {id}"
        )));
        run(&format!(
            "UPDATE lease.job SET next_at = clock_timestamp() WHERE id = {id}"
        ));
        let (_, e) = claim_one("w", "1 minute", "q");
        assert!(check(&format!(
            "SELECT lease.release({id}, 'w', {e}, 'retry', retry_at => '2100-01-01')"
        )));
        assert!(check(&format!(
            "SELECT next_at = '2100-01-01' FROM lease.job WHERE id = {id}"
        )));
    }

    #[pg_test]
    fn fail_dead_letters_and_abandon_gives_the_attempt_back() {
        let a = int("SELECT lease.enqueue('default', '{}', priority => 1)");
        let b = int("SELECT lease.enqueue('default', '{}')");
        let (_, ea) = claim_one("w", "1 minute", "default");
        let (_, eb) = claim_one("w", "1 minute", "default");
        assert!(check(&format!(
            "SELECT lease.release({a}, 'w', {ea}, 'fail', error => 'bad input')"
        )));
        assert!(check(&format!(
            "SELECT state = 'dead' AND last_error = 'bad input' FROM lease.job WHERE id = {a}"
        )));
        assert!(check(&format!(
            "SELECT lease.release({b}, 'w', {eb}, 'abandon')"
        )));
        assert!(check(&format!(
            "SELECT state = 'pending' AND attempt = 0 AND next_at <= clock_timestamp() FROM lease.job WHERE id = {b}"
        )));
        let (again, e2) = claim_one("v", "1 minute", "default");
        assert_eq!(again, b);
        assert!(e2 > eb);
    }

    #[pg_test]
    fn release_batch_releases_only_current_leases() {
        run("SELECT lease.create_queue('kept', retention => '1 hour')");
        run("SELECT lease.enqueue_batch('default', array_fill('{}'::jsonb, ARRAY[2]))");
        run("SELECT lease.enqueue('kept', '{}')");
        let (a, ea) = claim_one("w", "1 minute", "default");
        let (b, eb) = claim_one("w", "1 minute", "default");
        let (c, ec) = claim_one("w", "1 minute", "kept");
        let out: Vec<(i64, bool)> = Spi::connect(|client| {
            client
                .select(
                    &format!(
                        "SELECT id, released FROM lease.release_batch(
                            ARRAY[{c}, {b}, {a}], 'w', ARRAY[{ec}, {} , {ea}])",
                        eb + 7
                    ),
                    None,
                    &[],
                )
                .expect("release_batch")
                .map(|r| {
                    (
                        r.get::<i64>(1).unwrap().unwrap(),
                        r.get::<bool>(2).unwrap().unwrap(),
                    )
                })
                .collect()
        });
        assert_eq!(out, vec![(c, true), (b, false), (a, true)]);
        assert_eq!(
            int(&format!("SELECT count(*) FROM lease.job WHERE id = {a}")),
            0
        );
        assert!(check(&format!(
            "SELECT state = 'done' FROM lease.job WHERE id = {c}"
        )));
        assert!(check(&format!(
            "SELECT state = 'leased' FROM lease.job WHERE id = {b}"
        )));
        assert!(check(&format!(
            "SELECT bool_and(released) FROM lease.release_batch(ARRAY[{b}], 'w', ARRAY[{eb}], 'retry')"
        )));
        assert!(check(&format!(
            "SELECT state = 'pending' FROM lease.job WHERE id = {b}"
        )));
    }

    #[pg_test]
    fn batches_match_each_element_on_id_and_epoch() {
        run("SELECT lease.create_queue('kept', retention => '1 hour')");
        run("SELECT lease.enqueue('kept', '{}')");
        let (id, e) = claim_one("w", "1 minute", "kept");
        let stale = e - 1;
        assert!(check(&format!(
            "SELECT array_agg(held ORDER BY o) = ARRAY[false, true]
               FROM lease.renew_batch(ARRAY[{id}, {id}], 'w', ARRAY[{stale}, {e}], '1 minute')
                    WITH ORDINALITY AS r(id, held, lease_until, cancel_requested, o)"
        )));
        assert!(check(&format!(
            "SELECT array_agg(released ORDER BY o) = ARRAY[false, true]
               FROM lease.release_batch(ARRAY[{id}, {id}], 'w', ARRAY[{stale}, {e}])
                    WITH ORDINALITY AS r(id, released, o)"
        )));
        run("SELECT lease.enqueue('default', '{}')");
        let (id, e) = claim_one("w", "1 minute", "default");
        assert!(check(&format!(
            "SELECT array_agg(released ORDER BY o) = ARRAY[false, true]
               FROM lease.release_batch(ARRAY[{id}, {id}], 'w', ARRAY[{}, {e}])
                    WITH ORDINALITY AS r(id, released, o)",
            e - 1
        )));
    }

    // ---- fencing ------------------------------------------------------------

    #[pg_test]
    fn fenced_update_applies_only_under_the_current_epoch() {
        run("SELECT lease.enqueue('default', '{\"a\": 1, \"b\": 1}')");
        let (id, epoch) = claim_one("w", "1 minute", "default");
        assert!(check(&format!(
            "SELECT lease.fenced_update({id}, {epoch}, '{{\"b\": 2}}')"
        )));
        assert!(!check(&format!(
            "SELECT lease.fenced_update({id}, {}, '{{\"b\": 3}}')",
            epoch - 1
        )));
        assert!(check(&format!(
            "SELECT payload = '{{\"a\": 1, \"b\": 2}}' FROM lease.job WHERE id = {id}"
        )));
        assert_eq!(
            sqlstate(&format!("SELECT lease.fenced_update({id}, {epoch}, '[1]')")),
            "22023"
        );
        assert_eq!(
            sqlstate(&format!("SELECT lease.fenced_update({id}, {epoch}, NULL)")),
            "22004"
        );
    }

    #[pg_test]
    fn fence_guards_the_callers_own_writes() {
        run("SELECT lease.enqueue('default', '{}')");
        let (id, epoch) = claim_one("w", "1 minute", "default");
        assert!(check(&format!(
            "SELECT lease.fence({id}, {epoch}) > clock_timestamp() + interval '50 seconds'"
        )));
        assert_eq!(
            sqlstate(&format!("SELECT lease.fence({id}, {})", epoch + 1)),
            "LE001"
        );
        assert_eq!(
            sqlstate(&format!("SELECT lease.fence({id}, NULL)")),
            "22004"
        );
        assert!(check(&format!("SELECT lease.release({id}, 'w', {epoch})")));
        assert_eq!(
            sqlstate(&format!("SELECT lease.fence({id}, {epoch})")),
            "LE001"
        );
    }

    // ---- expiry and reap ----------------------------------------------------

    #[pg_test]
    fn reap_fences_the_old_owner_and_requeues_with_backoff() {
        run("SELECT lease.create_queue('q', backoff_base => '0', backoff_max => '0')");
        let id = int("SELECT lease.enqueue('q', '{\"v\": 0}')");
        let (_, old) = claim_one("a", "50 milliseconds", "q");
        let keep = int("SELECT lease.enqueue('q', '{}')");
        let (_, keep_epoch) = claim_one("c", "1 minute", "q");
        run("SELECT pg_sleep(0.1)");
        assert!(check(
            "SELECT array_agg(ROW(queue, requeued, dead, cancelled)::text) = ARRAY['(q,1,0,0)']
               FROM lease.reap()"
        ));
        assert!(check(&format!(
            "SELECT state = 'pending' AND epoch = {} AND attempt = 1 AND last_error LIKE 'lease expired%'
               FROM lease.job WHERE id = {id}",
            old + 1
        )));
        assert!(check(&format!(
            "SELECT state = 'leased' AND epoch = {keep_epoch} FROM lease.job WHERE id = {keep}"
        )));
        let (again, new) = claim_one("b", "1 minute", "q");
        assert_eq!(again, id);
        assert_eq!(new, old + 2);
        // The old owner is fenced out of every write.
        assert!(check(&format!(
            "SELECT NOT held FROM lease.renew({id}, 'a', {old}, '1 minute')"
        )));
        assert!(!check(&format!("SELECT lease.release({id}, 'a', {old})")));
        assert!(!check(&format!(
            "SELECT lease.fenced_update({id}, {old}, '{{\"v\": 1}}')"
        )));
        assert_eq!(
            sqlstate(&format!("SELECT lease.fence({id}, {old})")),
            "LE001"
        );
        assert!(check(&format!(
            "SELECT payload = '{{\"v\": 0}}' AND owner = 'b' AND epoch = {new} FROM lease.job WHERE id = {id}"
        )));
        assert_eq!(
            int("SELECT recovered_total FROM lease.queue_stats WHERE queue = 'q'"),
            1
        );
    }

    #[pg_test]
    fn reap_dead_letters_and_honours_cancel() {
        run("SELECT lease.create_queue('q', max_attempts => 1)");
        let poison = int("SELECT lease.enqueue('q', '{}', priority => 1)");
        let wanted = int("SELECT lease.enqueue('q', '{}')");
        run("SELECT lease.claim_pending(2, '50 milliseconds', 'w', 'q')");
        run("UPDATE lease.queue SET max_attempts = 5 WHERE name = 'q'");
        run(&format!(
            "UPDATE lease.job SET attempt = 5 WHERE id = {poison}"
        ));
        assert_eq!(
            text(&format!("SELECT lease.cancel({wanted})")).as_deref(),
            Some("cancel_requested")
        );
        run("SELECT pg_sleep(0.1)");
        assert!(check(
            "SELECT array_agg(ROW(queue, requeued, dead, cancelled)::text) = ARRAY['(q,0,1,1)'] FROM lease.reap()"
        ));
        assert!(check(&format!(
            "SELECT state = 'dead' FROM lease.job WHERE id = {poison}"
        )));
        assert!(check(&format!(
            "SELECT state = 'cancelled' FROM lease.job WHERE id = {wanted}"
        )));
        assert_eq!(int("SELECT count(*) FROM lease.reap()"), 0);
    }

    #[pg_test]
    fn reap_is_bounded() {
        run("SELECT lease.enqueue_batch('default', array_fill('{}'::jsonb, ARRAY[5]))");
        run("SELECT lease.claim_pending(5, '10 milliseconds', 'w')");
        run("SELECT pg_sleep(0.05)");
        assert_eq!(int("SELECT requeued FROM lease.reap(2)"), 2);
        assert_eq!(int("SELECT requeued FROM lease.reap(10)"), 3);
        assert_eq!(sqlstate("SELECT lease.reap(0)"), "22023");
        assert_eq!(sqlstate("SELECT lease.reap(NULL)"), "22004");
    }

    #[pg_test]
    fn purge_respects_retention() {
        run("SELECT lease.create_queue('q', retention => '1 second', dead_retention => '1 hour')");
        let done = int("SELECT lease.enqueue('q', '{}', priority => 1)");
        let dead = int("SELECT lease.enqueue('q', '{}')");
        let (_, e) = claim_one("w", "1 minute", "q");
        run(&format!("SELECT lease.release({done}, 'w', {e})"));
        let (_, e) = claim_one("w", "1 minute", "q");
        run(&format!("SELECT lease.release({dead}, 'w', {e}, 'fail')"));
        assert_eq!(int("SELECT lease.purge()"), 0);
        run("UPDATE lease.job SET finished_at = finished_at - interval '2 seconds'");
        assert_eq!(int("SELECT lease.purge()"), 1);
        assert_eq!(
            int(&format!("SELECT count(*) FROM lease.job WHERE id = {dead}")),
            1
        );
        assert_eq!(sqlstate("SELECT lease.purge(0)"), "22023");
    }

    #[pg_test]
    fn sweep_reaps_purges_and_counts() {
        run("SELECT lease.create_queue('q', retention => '0', backoff_base => '0', backoff_max => '0')");
        run("SELECT lease.enqueue_batch('q', array_fill('{}'::jsonb, ARRAY[3]))");
        run("SELECT lease.claim_pending(3, '10 milliseconds', 'w', 'q')");
        run("SELECT pg_sleep(0.05)");
        assert!(check(
            "SELECT recovered = 3 AND purged = 0 FROM lease.sweep()"
        ));
        assert!(check(
            "SELECT sweeps = 1 AND recovered = 3 AND last_error IS NULL AND last_sweep_at IS NOT NULL
               FROM lease.reaper_stats"
        ));
        assert_eq!(sqlstate("SELECT lease.sweep(0)"), "22023");
    }

    /// One queue's rows must not stop the reaper for the others. On main at
    /// 3729e87 the whole sweep failed and the good queue's expired lease
    /// stayed leased.
    #[pg_test]
    fn a_failing_queue_is_recorded_and_stops_no_other_queue() {
        // One queue whose rows cannot be reaped (a trigger, standing in for
        // any error a row could raise), one whose rows can.
        run("SELECT lease.create_queue('bad'); SELECT lease.create_queue('good')");
        run(
            "CREATE FUNCTION pg_temp.refuse() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'P0001'; END $$",
        );
        run(
            "CREATE TRIGGER refuse BEFORE UPDATE ON lease.job FOR EACH ROW
             WHEN (OLD.queue = 'bad') EXECUTE FUNCTION pg_temp.refuse()",
        );
        let bad = int("SELECT lease.enqueue('bad', '{}')");
        let good = int("SELECT lease.enqueue('good', '{}')");
        run("SELECT lease.claim_pending(1, '10 milliseconds', 'w', 'good')");
        run("ALTER TABLE lease.job DISABLE TRIGGER refuse");
        run("SELECT lease.claim_pending(1, '10 milliseconds', 'w', 'bad')");
        run("ALTER TABLE lease.job ENABLE TRIGGER refuse");
        run("SELECT pg_sleep(0.05)");
        assert!(check("SELECT recovered = 1 FROM lease.sweep()"));
        assert!(check(
            "SELECT sweeps = 1 AND last_error LIKE 'queue \"bad\": P0001: refused%' AND last_error_at IS NOT NULL
               FROM lease.reaper_stats"
        ));
        assert!(check(&format!(
            "SELECT state = 'leased' FROM lease.job WHERE id = {bad}"
        )));
        assert!(check(&format!(
            "SELECT state = 'pending' FROM lease.job WHERE id = {good}"
        )));
    }

    #[pg_test]
    fn epochs_start_at_the_timeline_floor() {
        assert!(check(
            "SELECT lease.epoch_floor() = (SELECT timeline_id FROM pg_control_checkpoint())::bigint << 40"
        ));
        run("SELECT lease.enqueue('default', '{}')");
        let (_, epoch) = claim_one("w", "1 minute", "default");
        assert_eq!(epoch, int("SELECT lease.epoch_floor()"));
    }

    /// What a promoted standby sees, simulated by lowering epochs below the
    /// floor: a lease whose claim was replicated is still its owner's (the
    /// row says so), and a row whose last claim was lost with the old
    /// primary gets an epoch above anything that primary could have issued.
    #[pg_test]
    fn leases_from_an_earlier_timeline() {
        run("SELECT lease.create_queue('q', backoff_base => '0', backoff_max => '0')");
        let f = int("SELECT lease.epoch_floor()");

        let kept = int("SELECT lease.enqueue('q', '{}')");
        claim_one("old", "1 hour", "q");
        let old = f - 7;
        run(&format!(
            "UPDATE lease.job SET epoch = {old} WHERE id = {kept}"
        ));
        assert!(check(&format!(
            "SELECT held FROM lease.renew({kept}, 'old', {old}, '1 minute')"
        )));
        assert_eq!(int("SELECT count(*) FROM lease.reap()"), 0);
        assert!(check(&format!(
            "SELECT lease.release({kept}, 'old', {old})"
        )));

        // The dead primary issued (lost, old + 1) to someone; the new claim
        // must not hand that token out again.
        let lost = int("SELECT lease.enqueue('q', '{}')");
        run(&format!(
            "UPDATE lease.job SET epoch = {old} WHERE id = {lost}"
        ));
        let (again, epoch) = claim_one("new", "1 minute", "q");
        assert_eq!(again, lost);
        assert_eq!(epoch, f);
        assert!(!check(&format!(
            "SELECT lease.release({lost}, 'new', {})",
            old + 1
        )));
    }

    // ---- cancel -------------------------------------------------------------

    #[pg_test]
    fn cancel_intent_survives_every_transition() {
        let pending =
            int("SELECT lease.enqueue('default', '{}', run_at => now() + interval '1 hour')");
        assert_eq!(
            text(&format!("SELECT lease.cancel({pending})")).as_deref(),
            Some("cancelled")
        );
        assert_eq!(
            text(&format!("SELECT lease.cancel({pending})")).as_deref(),
            Some("cancelled")
        );

        for outcome in ["retry", "abandon"] {
            let id = int("SELECT lease.enqueue('default', '{}')");
            let (_, e) = claim_one("w", "1 minute", "default");
            assert_eq!(
                text(&format!("SELECT lease.cancel({id})")).as_deref(),
                Some("cancel_requested")
            );
            assert!(check(&format!(
                "SELECT cancel_requested FROM lease.renew({id}, 'w', {e}, '1 minute')"
            )));
            assert!(check(&format!(
                "SELECT lease.release({id}, 'w', {e}, '{outcome}')"
            )));
            assert!(
                check(&format!(
                    "SELECT state = 'cancelled' FROM lease.job WHERE id = {id}"
                )),
                "{outcome}"
            );
        }

        run("SELECT lease.create_queue('kept', retention => '1 hour')");
        let id = int("SELECT lease.enqueue('kept', '{}')");
        let (_, e) = claim_one("w", "1 minute", "kept");
        run(&format!("SELECT lease.cancel({id})"));
        assert!(check(&format!(
            "SELECT lease.release({id}, 'w', {e}, 'done')"
        )));
        assert_eq!(
            text(&format!("SELECT lease.cancel({id})")).as_deref(),
            Some("done")
        );
        assert_eq!(text("SELECT lease.cancel(123456789)"), None);
        assert_eq!(sqlstate("SELECT lease.cancel(NULL)"), "22004");
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'w')"),
            0
        );
    }

    // ---- named leases -------------------------------------------------------

    #[pg_test]
    fn named_lease_has_one_holder_and_growing_epochs() {
        let f = int("SELECT lease.epoch_floor()");
        assert_eq!(
            int("SELECT lease.try_acquire('leader', 'a', '1 minute')"),
            f
        );
        assert!(check(
            "SELECT lease.try_acquire('leader', 'b', '1 minute') IS NULL"
        ));
        assert!(check(&format!(
            "SELECT lease.renew_named('leader', 'a', {f}, '2 minutes') > clock_timestamp() + interval '1 minute'"
        )));
        assert!(check(&format!(
            "SELECT lease.renew_named('leader', 'b', {f}, '2 minutes') IS NULL"
        )));
        // The same owner name re-acquiring (a restarted process) fences its
        // earlier incarnation.
        assert_eq!(
            int("SELECT lease.try_acquire('leader', 'a', '1 minute')"),
            f + 1
        );
        assert!(check(&format!(
            "SELECT lease.renew_named('leader', 'a', {f}, '1 minute') IS NULL"
        )));
        assert_eq!(
            sqlstate(&format!("SELECT lease.fence_named('leader', {f})")),
            "LE001"
        );
        assert!(check(&format!(
            "SELECT lease.fence_named('leader', {}) > clock_timestamp()",
            f + 1
        )));
        assert!(check(&format!(
            "SELECT lease.release_named('leader', 'a', {})",
            f + 1
        )));
        assert!(!check(&format!(
            "SELECT lease.release_named('leader', 'a', {})",
            f + 1
        )));
        assert_eq!(int("SELECT count(*) FROM lease.holders"), 0);
        assert_eq!(
            int("SELECT lease.try_acquire('leader', 'b', '50 milliseconds')"),
            f + 2
        );
        assert!(check(&format!(
            "SELECT owner = 'b' AND epoch = {} FROM lease.holders WHERE name = 'leader'",
            f + 2
        )));
        run("SELECT pg_sleep(0.1)");
        assert!(check(&format!(
            "SELECT lease.renew_named('leader', 'b', {}, '1 minute') IS NULL",
            f + 2
        )));
        assert_eq!(
            int("SELECT lease.try_acquire('leader', 'c', '1 minute')"),
            f + 3
        );
    }

    #[pg_test]
    fn named_lease_rejects_bad_input() {
        let bad = [
            ("SELECT lease.try_acquire(NULL, 'a', '1 minute')", "22004"),
            ("SELECT lease.try_acquire('', 'a', '1 minute')", "22023"),
            ("SELECT lease.try_acquire('n', '', '1 minute')", "22023"),
            ("SELECT lease.try_acquire('n', 'a', '0')", "22023"),
            (
                "SELECT lease.renew_named('n', 'a', NULL, '1 minute')",
                "22004",
            ),
            ("SELECT lease.release_named('n', NULL, 1)", "22004"),
            ("SELECT lease.fence_named(NULL, 1)", "22004"),
        ];
        for (sql, state) in bad {
            assert_eq!(sqlstate(sql), state, "{sql}");
        }
        assert_eq!(int("SELECT count(*) FROM lease.named_lease"), 0);
    }

    // ---- views --------------------------------------------------------------

    #[pg_test]
    fn views_report_depth_leases_and_age() {
        run("SELECT lease.enqueue_batch('default', array_fill('{}'::jsonb, ARRAY[3]), run_at => now() - interval '1 minute')");
        run("SELECT lease.enqueue('default', '{}', run_at => now() + interval '1 hour')");
        run("SELECT lease.claim_pending(1, '1 minute', 'w')");
        assert!(check(
            "SELECT pending = 3 AND ready = 2 AND leased = 1 AND expired = 0 AND done = 0
                    AND oldest_ready_age >= interval '1 minute'
               FROM lease.queue_stats WHERE queue = 'default'"
        ));
        assert!(check(
            "SELECT owner = 'w' AND remaining > interval '50 seconds' FROM lease.in_flight"
        ));
    }

    // ---- privileges and hygiene ---------------------------------------------

    #[pg_test]
    fn roles_limit_who_can_do_what() {
        run("SELECT lease.enqueue('default', '{\"secret\": 1}')");
        run("CREATE ROLE lease_test_nobody; CREATE ROLE lease_test_worker IN ROLE lease_worker");
        // Create the helper while still superuser.
        assert_eq!(sqlstate("SELECT 1"), "00000");

        run("SET LOCAL ROLE lease_test_nobody");
        assert_eq!(
            sqlstate("SELECT lease.claim_pending(1, '1 minute', 'x')"),
            "42501"
        );
        assert_eq!(sqlstate("SELECT payload FROM lease.job"), "42501");
        assert_eq!(sqlstate("SELECT lease.release(1, 'x', 1)"), "42501");
        assert_eq!(sqlstate("SELECT * FROM lease.queue_stats"), "42501");

        run("RESET ROLE; SET LOCAL ROLE lease_test_worker");
        assert_eq!(sqlstate("SELECT payload FROM lease.job"), "42501");
        assert_eq!(sqlstate("UPDATE lease.job SET epoch = 99"), "42501");
        assert_eq!(sqlstate("SELECT lease.create_queue('mine')"), "42501");
        assert_eq!(sqlstate("SELECT lease.reap()"), "42501");
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(1, '1 minute', 'x')"),
            1
        );
        run("RESET ROLE");
    }

    // ---- attached tables ----------------------------------------------------

    /// The rows of `items` (text keys) whose status is 'todo', attached.
    fn attach_items() {
        run("CREATE TABLE items (k text PRIMARY KEY, status text NOT NULL)");
        run("INSERT INTO items VALUES ('a', 'todo'), ('b', 'todo'), ('c', 'other')");
        assert_eq!(
            text("SELECT lease.attach('items', pending => $$status = 'todo'$$)").as_deref(),
            Some("items")
        );
    }

    fn keys() -> String {
        text("SELECT string_agg(key || ':' || state, ',' ORDER BY key) FROM lease.job WHERE queue = 'items'")
            .unwrap_or_default()
    }

    #[pg_test]
    fn attached_rows_follow_the_predicate() {
        attach_items();
        assert_eq!(keys(), "a:pending,b:pending");
        run("INSERT INTO items VALUES ('d', 'todo'), ('e', 'other')");
        run("UPDATE items SET status = 'todo' WHERE k = 'c'");
        // Unrelated writes to matching rows change nothing.
        run("UPDATE items SET status = status");
        assert_eq!(keys(), "a:pending,b:pending,c:pending,d:pending");

        let (id, epoch) = claim_one("w", "1 minute", "items");
        let key = text(&format!("SELECT key FROM lease.job WHERE id = {id}")).expect("key");
        // The owner's fenced write that ends the predicate ends the lease.
        run(&format!(
            "UPDATE items SET status = 'done' WHERE k = '{key}' AND lease.fence({id}, {epoch}) IS NOT NULL"
        ));
        assert!(check(&format!(
            "SELECT NOT held FROM lease.renew({id}, 'w', {epoch}, '1 minute')"
        )));
        assert_eq!(
            sqlstate(&format!(
                "UPDATE items SET status = 'x' WHERE k = '{key}' AND lease.fence({id}, {epoch}) IS NOT NULL"
            )),
            "LE001"
        );
        // A changed primary key, a delete, a row matching again.
        run("UPDATE items SET k = 'z' WHERE k = 'd'");
        run("DELETE FROM items WHERE k = 'c'");
        run(&format!(
            "UPDATE items SET status = 'todo' WHERE k = '{key}'"
        ));
        assert_eq!(
            text("SELECT string_agg(key, ',' ORDER BY key) FROM lease.job WHERE queue = 'items'")
                .as_deref(),
            Some("a,b,z")
        );
        // The row matching again is new work: a new id, hence a new token.
        assert!(check(&format!(
            "SELECT id <> {id} FROM lease.job WHERE key = '{key}'"
        )));
    }

    #[pg_test]
    fn detach_removes_everything_attach_added() {
        attach_items();
        claim_one("w", "1 minute", "items");
        assert_eq!(int("SELECT lease.detach('items')"), 2);
        assert_eq!(
            int("SELECT count(*) FROM lease.job WHERE queue = 'items'"),
            0
        );
        assert_eq!(
            int("SELECT count(*) FROM lease.queue WHERE name = 'items'"),
            0
        );
        assert_eq!(int("SELECT count(*) FROM lease.attachment"), 0);
        assert_eq!(
            int("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'items'::regclass"),
            0
        );
        assert_eq!(int("SELECT count(*) FROM items"), 3);
        run("INSERT INTO items VALUES ('f', 'todo')");
        assert_eq!(int("SELECT count(*) FROM lease.job"), 0);
    }

    #[pg_test]
    fn attach_rejects_bad_input_and_changes_nothing() {
        run("CREATE TABLE two_keys (a int, b int, PRIMARY KEY (a, b))");
        run("CREATE TABLE no_key (a int)");
        run("CREATE TABLE numeric_key (a numeric PRIMARY KEY)");
        run("CREATE TABLE ok (id bigint PRIMARY KEY, s text)");
        for (sql, state) in [
            ("SELECT lease.attach('two_keys', 'true')", "0A000"),
            ("SELECT lease.attach('no_key', 'true')", "0A000"),
            ("SELECT lease.attach('numeric_key', 'true')", "0A000"),
            ("SELECT lease.attach('ok', 'nosuch = 1')", "42703"),
            (
                "SELECT lease.attach('ok', 's = ''x''; DROP TABLE ok')",
                "42601",
            ),
            ("SELECT lease.attach('ok', 's')", "42804"),
            ("SELECT lease.attach('ok', 'id IN (SELECT 1)')", "0A000"),
            ("SELECT lease.attach('ok', NULL)", "22004"),
            ("SELECT lease.attach(NULL, 'true')", "22004"),
            (
                "SELECT lease.attach('ok', 'true', queue => 'default')",
                "42710",
            ),
            (
                "SELECT lease.attach('ok', 'true', max_attempts => 0)",
                "22023",
            ),
            ("SELECT lease.detach('ok')", "42704"),
        ] {
            assert_eq!(sqlstate(sql), state, "{sql}");
        }
        assert_eq!(int("SELECT count(*) FROM lease.attachment"), 0);
        assert_eq!(
            int("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'ok'::regclass"),
            0
        );
        run("SELECT lease.attach('ok', 'true')");
        assert_eq!(sqlstate("SELECT lease.attach('ok', 'true')"), "42710");
        assert_eq!(sqlstate("SELECT lease.drop_queue('ok', true)"), "55006");
    }

    #[pg_test]
    fn release_and_claim_releases_in_order_then_claims() {
        run("SELECT lease.enqueue_batch('default', array_fill('{}'::jsonb, ARRAY[4]))");
        let (a, ea) = claim_one("w", "1 minute", "default");
        let (b, eb) = claim_one("w", "1 minute", "default");
        // b's stale epoch is refused; a is released; two more rows claimed.
        let stale = eb - 1;
        assert_eq!(
            text(&format!(
                "SELECT string_agg(coalesce(released::text, 'claim'), ',')
                   FROM lease.release_and_claim(ARRAY[{a}, {b}], 'w', ARRAY[{ea}, {stale}], 2, '1 minute')"
            ))
            .as_deref(),
            Some("true,false,claim,claim")
        );
        assert_eq!(
            int("SELECT count(*) FROM lease.job WHERE state = 'leased'"),
            3
        );
        assert_eq!(
            int(&format!(
                "SELECT count(*) FROM lease.release_and_claim(ARRAY[{b}], 'w', ARRAY[{eb}], 0, '1 minute')"
            )),
            1
        );
        assert_eq!(
            int("SELECT count(*) FROM lease.job WHERE state = 'leased'"),
            2
        );
        assert_eq!(
            sqlstate("SELECT lease.release_and_claim('{}', 'w', '{}', -1, '1 minute')"),
            "22023"
        );
        assert_eq!(
            sqlstate("SELECT lease.release_and_claim('{}', 'w', '{}', NULL, '1 minute')"),
            "22004"
        );
    }

    #[pg_test]
    fn reclaim_own_takes_back_an_owners_leases_under_new_epochs() {
        run("SELECT lease.enqueue_batch('default', array_fill('{}'::jsonb, ARRAY[3]))");
        let (id, old) = claim_one("p", "1 minute", "default");
        claim_one("someone-else", "1 minute", "default");
        let (again, epoch) = Spi::get_two::<i64, i64>(
            "SELECT id, epoch FROM lease.reclaim_own(10, '1 minute', 'p')",
        )
        .expect("reclaim_own");
        assert_eq!(again, Some(id));
        assert!(epoch.expect("epoch") > old);
        assert_eq!(
            int("SELECT count(*) FROM lease.reclaim_own(10, '1 minute', 'nobody')"),
            0
        );
        assert!(check(&format!(
            "SELECT NOT held FROM lease.renew({id}, 'p', {old}, '1 minute')"
        )));
        assert_eq!(
            sqlstate("SELECT lease.reclaim_own(1, '1 minute', 'p', 'nosuch')"),
            "42704"
        );
        assert_eq!(
            sqlstate("SELECT lease.reclaim_own(0, '1 minute', 'p')"),
            "22023"
        );
    }

    #[pg_test]
    fn every_function_is_documented_and_definers_pin_search_path() {
        let undocumented = text(
            "SELECT string_agg(p.oid::regprocedure::text, ', ')
               FROM pg_proc p
              WHERE p.pronamespace = 'lease'::regnamespace
                AND obj_description(p.oid, 'pg_proc') IS NULL",
        );
        assert_eq!(undocumented, None, "functions without COMMENT ON");
        let unpinned = text(
            "SELECT string_agg(p.oid::regprocedure::text, ', ')
               FROM pg_proc p
              WHERE p.pronamespace = 'lease'::regnamespace AND p.prosecdef
                AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)",
        );
        assert_eq!(
            unpinned, None,
            "SECURITY DEFINER functions without a pinned search_path"
        );
        let public = text(
            "SELECT string_agg(p.oid::regprocedure::text, ', ')
               FROM pg_proc p
              WHERE p.pronamespace = 'lease'::regnamespace
                AND has_function_privilege('public', p.oid, 'EXECUTE')",
        );
        assert_eq!(public, None, "functions executable by PUBLIC");
    }

    /// lease.schedule (issue 18): first occurrence, keys, exactly one row
    /// per occurrence from the sweep step, `skip` and `catch_up` after an
    /// outage, unschedule, and the queue's schedules going with the queue.
    #[pg_test]
    fn schedules_enqueue_each_occurrence_once() {
        run("SELECT lease.create_queue('ticks')");
        assert!(check(
            "SELECT lease.schedule('hourly', 'ticks', every => '1 hour', payload => '{\"r\": 1}')
                    BETWEEN clock_timestamp() + interval '59 minutes' AND clock_timestamp() + interval '1 hour'"
        ));
        assert_eq!(int("SELECT lease._enqueue_due(100)"), 0, "nothing due yet");
        // An outage of three and a half periods: three occurrences missed.
        let outage = "UPDATE lease.schedule SET anchor = anchor - interval '3 hours 30 minutes',
                                                next_at = next_at - interval '3 hours 30 minutes'";
        run(outage);
        assert_eq!(
            int("SELECT lease._enqueue_due(100)"),
            1,
            "skip: the latest only"
        );
        assert_eq!(
            int("SELECT lease._enqueue_due(100)"),
            0,
            "each occurrence once"
        );
        assert!(check(
            "SELECT key = format('schedule:hourly@%s',
                                 to_char(next_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))
                    AND next_at < clock_timestamp() AND payload = '{\"r\": 1}'
               FROM lease.job WHERE queue = 'ticks'"
        ));
        assert!(check(
            "SELECT next_at > clock_timestamp() AND enqueued = 1 FROM lease.schedule WHERE name = 'hourly'"
        ));
        run("DELETE FROM lease.job WHERE queue = 'ticks'");
        run("SELECT lease.schedule('hourly', 'ticks', every => '1 hour', missed => 'catch_up')");
        run(outage);
        assert_eq!(
            int("SELECT lease._enqueue_due(100)"),
            3,
            "catch_up: every one"
        );
        assert_eq!(
            int("SELECT count(DISTINCT key) FROM lease.job WHERE queue = 'ticks'"),
            3
        );
        // Cron, in UTC, with an optional seconds field.
        assert!(check(
            "SELECT lease.schedule('top', 'ticks', cron => '0 * * * *')
                    = date_trunc('hour', clock_timestamp() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '1 hour'"
        ));
        // 2026-12-01 10:15:00 UTC.
        assert_eq!(
            int("SELECT lease._cron_next('0 * * * *', 1796120100)::bigint"),
            1_796_122_800
        );
        assert_eq!(
            int("SELECT lease._cron_next('*/5 * * * * *', 1796120100)::bigint"),
            1_796_120_105
        );
        assert_eq!(
            int("SELECT lease._cron_last('15 10 * * *', 1796120100)::bigint"),
            1_796_120_100
        );
        assert!(check("SELECT lease.unschedule('top')"));
        assert!(!check("SELECT lease.unschedule('top')"));
        run("SELECT lease.drop_queue('ticks', force => true)");
        assert_eq!(
            int("SELECT count(*) FROM lease.schedule"),
            0,
            "gone with the queue"
        );
    }

    #[pg_test]
    fn schedule_refuses_bad_input_and_changes_nothing() {
        run("SELECT lease.create_queue('ticks')");
        for (sql, code) in [
            ("SELECT lease.schedule('s', 'ticks')", "22023"),
            (
                "SELECT lease.schedule('s', 'ticks', cron => '* * * * *', every => '1 minute')",
                "22023",
            ),
            (
                "SELECT lease.schedule('s', 'ticks', cron => '61 * * * *')",
                "22023",
            ),
            (
                "SELECT lease.schedule('s', 'ticks', cron => 'every minute')",
                "22023",
            ),
            ("SELECT lease.schedule('s', 'ticks', every => '0')", "22023"),
            (
                "SELECT lease.schedule('s', 'ticks', every => '1 month')",
                "22023",
            ),
            (
                "SELECT lease.schedule('s', 'ticks', every => '1 minute', missed => 'later')",
                "22023",
            ),
            (
                "SELECT lease.schedule('', 'ticks', every => '1 minute')",
                "22023",
            ),
            (
                "SELECT lease.schedule(NULL, 'ticks', every => '1 minute')",
                "22004",
            ),
            (
                "SELECT lease.schedule('s', 'ticks', every => '1 minute', payload => NULL)",
                "22004",
            ),
            (
                "SELECT lease.schedule('s', 'nope', every => '1 minute')",
                "42704",
            ),
        ] {
            assert_eq!(sqlstate(sql), code, "{sql}");
        }
        assert_eq!(int("SELECT count(*) FROM lease.schedule"), 0);
    }

    // ---- per-key concurrency ------------------------------------------------

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
