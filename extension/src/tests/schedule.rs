//! Schedules (`sql/schedule.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

    /// lease.schedule: first occurrence, keys, exactly one row
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
            // Shorter than the reaper can honour.
            (
                "SELECT lease.schedule('s', 'ticks', every => '50 milliseconds')",
                "22023",
            ),
            // A seventh field would be read as a year.
            (
                "SELECT lease.schedule('s', 'ticks', cron => '0 0 0 1 1 * 2030')",
                "22023",
            ),
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
}
