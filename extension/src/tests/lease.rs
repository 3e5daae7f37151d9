//! Holding and ending a lease: renew and release, single and batch (`sql/lease.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

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
}
