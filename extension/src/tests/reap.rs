//! Expiry, reap, purge, sweep and the epochs' timeline floor (`sql/reap.sql`, `sql/sweep.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

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

    /// One queue's rows must not stop the reaper for the others. Before the
    /// fix the whole sweep failed and the good queue's expired lease
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
}
