//! Per-queue access (`lease.grant`), probed by a worker that holds no right
//! on a restricted queue: it must not learn whether the queue, or a key in
//! it, exists.

use pg_tests::{sqlstate, Cluster, SUPERUSER, TEST_DB};
use tokio_postgres::Client;

/// The SQLSTATE and message `sql` fails with; panics if it succeeds.
async fn answer(client: &Client, sql: &str) -> (String, String) {
    match client.batch_execute(sql).await {
        Ok(()) => panic!("expected an error from: {sql}"),
        Err(err) => (
            sqlstate(&err).unwrap_or_default(),
            err.as_db_error()
                .map(|e| format!("{} / {:?}", e.message(), e.hint()))
                .unwrap_or_default(),
        ),
    }
}

/// Low: an existence oracle across queues. `cancel_key` on a restricted
/// queue answered 42501 for an existing key and NULL for a missing one, and
/// every function answered 42501 for a restricted queue's name but 42704
/// for a name no queue has (failed before: both differed). Now, to a role
/// that holds no right on it, a restricted queue answers exactly what a
/// queue that does not exist answers, and a key is looked up only after
/// the check. A role that holds the other right learns the queue exists,
/// which it knows anyway; a row given by id does not name its queue.
#[tokio::test]
async fn a_role_without_a_grant_learns_nothing_of_a_restricted_queue() {
    let cluster = Cluster::start();
    // Roles need a superuser (the install without the library has none).
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "CREATE ROLE alice LOGIN IN ROLE lease_worker;
         CREATE ROLE b LOGIN IN ROLE lease_worker;
         CREATE ROLE feeder LOGIN IN ROLE lease_worker;
         SELECT lease.create_queue('qb');
         SELECT lease.grant('qb', 'b');
         SELECT lease.grant('qb', 'feeder', work => false);
         SELECT lease.enqueue('qb', '{}', key => 'k');",
    )
    .await
    .expect("b's restricted queue with key k");
    let alice = cluster.connect_to(TEST_DB, "alice").await;

    let probes = [
        "SELECT lease.cancel_key('{q}', 'k')",
        "SELECT lease.cancel_key('{q}', 'missing')",
        "SELECT lease.enqueue('{q}', '{{}}')",
        "SELECT lease.enqueue_batch('{q}', ARRAY['{{}}'::jsonb])",
        "SELECT lease.claim_pending(1, '1 minute', 'alice', '{q}')",
        "SELECT lease.reclaim_own(1, '1 minute', 'alice', '{q}')",
        "SELECT lease.ready_channel('{q}')",
        "SELECT lease.rate_wait('{q}')",
        "SELECT lease.bind_session('{q}', 'alice')",
    ];
    for probe in probes {
        let restricted = answer(&alice, &probe.replace("{q}", "qb").replace("{{}}", "{}")).await;
        let missing = answer(&alice, &probe.replace("{q}", "nope").replace("{{}}", "{}")).await;
        assert_eq!(
            restricted.1.replace("qb", "nope"),
            missing.1,
            "{probe}: the messages differ"
        );
        assert_eq!(restricted.0, missing.0, "{probe}");
        assert_eq!(restricted.0, "42704", "{probe}");
    }
    // The key's existence does not show either.
    let with_key = answer(&alice, "SELECT lease.cancel_key('qb', 'k')").await;
    let without = answer(&alice, "SELECT lease.cancel_key('qb', 'missing')").await;
    assert_eq!(with_key, without);

    // A row given by id: refused without naming its queue.
    let id: i64 = pg_tests::scalar(&su, "SELECT id FROM lease.job WHERE key = 'k'").await;
    let (code, message) = answer(&alice, &format!("SELECT lease.cancel({id})")).await;
    assert_eq!(code, "42501");
    assert!(!message.contains("qb"), "{message}");

    // A producer of qb knows it exists: it is told what it lacks.
    let feeder = cluster.connect_to(TEST_DB, "feeder").await;
    let (code, message) = answer(
        &feeder,
        "SELECT lease.claim_pending(1, '1 minute', 'feeder', 'qb')",
    )
    .await;
    assert_eq!(code, "42501", "{message}");

    // Nothing changed: the row is pending, nothing was enqueued.
    let state: String =
        pg_tests::scalar(&su, "SELECT string_agg(state::text, ',') FROM lease.job").await;
    assert_eq!(state, "pending");
}
