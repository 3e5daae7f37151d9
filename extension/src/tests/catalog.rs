//! What the catalog promises: the views, the roles, and every function documented with a pinned search_path.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

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
        // The views' readers (views.sql) are PUBLIC's: each checks that its
        // caller may read the view it returns.
        let readers = "ARRAY['lease.read_metrics()', 'lease.read_queue_stats()',
                             'lease.read_in_flight(text)', 'lease.read_fairness_keys(text)',
                             'lease.read_dead_letters(text, bigint)']::regprocedure[]";
        let public = text(&format!(
            "SELECT string_agg(p.oid::regprocedure::text, ', ')
               FROM pg_proc p
              WHERE p.pronamespace = 'lease'::regnamespace
                AND has_function_privilege('public', p.oid, 'EXECUTE')
                AND p.oid <> ALL ({readers})"
        ));
        assert_eq!(public, None, "functions executable by PUBLIC");
        let unchecked = text(&format!(
            "SELECT string_agg(p.oid::regprocedure::text, ', ')
               FROM pg_proc p JOIN pg_type t ON t.oid = p.prorettype
              WHERE p.oid = ANY ({readers})
                AND position(format('PERFORM lease._check_reader(''lease.%s'')', t.typname) IN p.prosrc) = 0"
        ));
        assert_eq!(unchecked, None, "readers that do not check their caller");
    }
}
