//! Claims: `claim_pending`, `release_and_claim`, `reclaim_own` (`sql/claim.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

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
}
