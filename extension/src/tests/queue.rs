//! Queues, enqueue and cancel (`sql/queue.sql`).

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::tests::support::*;

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

    /// Failed before pause existed (42883).
    #[pg_test]
    fn a_paused_queue_is_not_claimed_and_its_leases_run_on() {
        run("SELECT lease.create_queue('q')");
        run("SELECT lease.enqueue('q', '{}') FROM generate_series(1, 2)");
        run("SELECT lease.claim_pending(1, '1 minute', 'a', 'q')");
        assert!(check("SELECT lease.pause('q')"));
        assert!(!check("SELECT lease.pause('q')"), "paused already");
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'b', 'q')"),
            0
        );
        assert!(check(
            "SELECT held FROM lease.renew((SELECT id FROM lease.job WHERE state = 'leased'), 'a',
                                         (SELECT epoch FROM lease.job WHERE state = 'leased'), '1 minute')"
        ));
        assert!(check("SELECT lease.resume('q')"));
        assert!(!check("SELECT lease.resume('q')"), "running already");
        assert_eq!(
            int("SELECT count(*) FROM lease.claim_pending(10, '1 minute', 'b', 'q')"),
            1
        );
        assert_eq!(sqlstate("SELECT lease.pause('nope')"), "42704");
        assert_eq!(sqlstate("SELECT lease.pause(NULL)"), "22004");
    }

    /// Failed before purge_dead existed (42883).
    #[pg_test]
    fn purge_dead_deletes_one_queues_dead_letters() {
        run("SELECT lease.create_queue('q', max_attempts => 1)");
        run("SELECT lease.create_queue('r', max_attempts => 1)");
        for q in ["q", "q", "r"] {
            run(&format!(
                "SELECT lease.enqueue('{q}', '{{}}');
                 SELECT lease.release(c.id, 'w', c.epoch, 'fail')
                   FROM lease.claim_pending(1, '1 minute', 'w', '{q}') c"
            ));
        }
        assert_eq!(int("SELECT lease.purge_dead('q')"), 2);
        assert_eq!(int("SELECT count(*) FROM lease.job WHERE queue = 'q'"), 0);
        assert_eq!(
            int("SELECT count(*) FROM lease.job WHERE queue = 'r' AND state = 'dead'"),
            1
        );
        assert_eq!(int("SELECT dead FROM lease.metrics WHERE queue = 'q'"), 0);
        run("CREATE TABLE t (id int PRIMARY KEY, s text); SELECT lease.attach('t', 's = ''new''')");
        assert_eq!(sqlstate("SELECT lease.purge_dead('t')"), "42809");
        assert_eq!(sqlstate("SELECT lease.purge_dead('nope')"), "42704");
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
}
