//! Named leases (`sql/named.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

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
}
