//! The payload cap (`max_payload_bytes`), attacked by a worker: every path
//! that stores a payload refuses one over its queue's limit (22023) and
//! changes nothing, whatever size the payload would take once stored.

use pg_tests::{scalar, sqlstate, Cluster, SUPERUSER, TEST_DB};

/// Low: `enqueue` took any payload (200 MB in 5 s before the fix).
/// Here a worker's payload over the queue's limit (1 MiB by default) is
/// refused with 22023 by `enqueue`, `enqueue_batch` and a `fenced_update`
/// that would grow it, and nothing changes; an admin raises the limit per
/// queue.
#[tokio::test]
async fn payloads_over_the_queue_limit_are_refused() {
    let cluster = Cluster::start();
    // Roles need a superuser (the install without the library has none).
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute("CREATE ROLE alice LOGIN IN ROLE lease_worker")
        .await
        .expect("alice");
    let alice = cluster.connect_to(TEST_DB, "alice").await;
    let big = "jsonb_build_object('blob', repeat('x', 2000000))";
    for sql in [
        format!("SELECT lease.enqueue('default', {big})"),
        format!("SELECT lease.enqueue_batch('default', ARRAY['{{}}'::jsonb, {big}])"),
    ] {
        let err = alice.batch_execute(&sql).await.expect_err(&sql);
        assert_eq!(sqlstate(&err).as_deref(), Some("22023"), "{sql}");
    }
    let rows: i64 = scalar(&su, "SELECT count(*) FROM lease.job").await;
    assert_eq!(rows, 0, "nothing enqueued");

    alice
        .batch_execute("SELECT lease.enqueue('default', '{\"n\": 1}')")
        .await
        .expect("small enqueue");
    let row = alice
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'alice', 'default')",
            &[],
        )
        .await
        .expect("claim");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    let err = alice
        .execute(
            &format!("SELECT lease.fenced_update($1, $2, {big})"),
            &[&id, &epoch],
        )
        .await
        .expect_err("grown over the limit");
    assert_eq!(sqlstate(&err).as_deref(), Some("22023"));
    let payload: String = scalar(
        &su,
        &format!("SELECT payload::text FROM lease.job WHERE id = {id}"),
    )
    .await;
    assert_eq!(payload, "{\"n\": 1}", "the payload is unchanged");

    su.batch_execute("SELECT lease.create_queue('default', max_payload_bytes => 4194304)")
        .await
        .expect("raised");
    alice
        .batch_execute(&format!("SELECT lease.enqueue('default', {big})"))
        .await
        .expect("accepted under the raised limit");
}

/// Medium: the cap was checked with `pg_column_size`, so a payload read
/// from a column was judged by its compressed size: 64 MB and 200 MB
/// payloads were accepted (784 kB stored), delivered to workers and the
/// dashboard, while the same value written out got 22023 (failed before:
/// each of these was accepted). Now the cap is on the text form's size.
#[tokio::test]
async fn a_payload_is_judged_by_its_size_not_by_how_well_it_compresses() {
    let cluster = Cluster::start();
    // Roles need a superuser (the install without the library has none).
    let su = cluster.connect_to(TEST_DB, SUPERUSER).await;
    su.batch_execute(
        "CREATE ROLE alice LOGIN IN ROLE lease_worker;
         CREATE ROLE ops LOGIN IN ROLE lease_admin;",
    )
    .await
    .expect("roles");
    let alice = cluster.connect_to(TEST_DB, "alice").await;
    // 8 MB of text that compresses to about 100 kB, stored in a table of
    // alice's own, so that it is read back compressed.
    alice
        .batch_execute(
            "CREATE TEMP TABLE big AS SELECT jsonb_build_object('blob', repeat('x', 8000000)) AS p;",
        )
        .await
        .expect("a compressible payload in a table");
    let stored: i32 = scalar(&alice, "SELECT pg_column_size(p) FROM big").await;
    assert!(stored < 1_048_576, "the premise: stored in {stored} bytes");
    for sql in [
        "SELECT lease.enqueue('default', (SELECT p FROM big))",
        "SELECT lease.enqueue_batch('default', ARRAY(SELECT p FROM big))",
    ] {
        let err = alice.batch_execute(sql).await.expect_err(sql);
        assert_eq!(sqlstate(&err).as_deref(), Some("22023"), "{sql}");
    }
    alice
        .batch_execute("SELECT lease.enqueue('default', '{\"n\": 1}')")
        .await
        .expect("a small one");
    let row = alice
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 minute', 'alice', 'default')",
            &[],
        )
        .await
        .expect("claim");
    let (id, epoch): (i64, i64) = (row.get(0), row.get(1));
    let err = alice
        .execute(
            "SELECT lease.fenced_update($1, $2, (SELECT p FROM big))",
            &[&id, &epoch],
        )
        .await
        .expect_err("grown over the limit, stored compressed");
    assert_eq!(sqlstate(&err).as_deref(), Some("22023"));
    let rows: i64 = scalar(
        &su,
        "SELECT count(*) FROM lease.job WHERE octet_length(payload::text) > 1048576",
    )
    .await;
    assert_eq!(rows, 0, "no large payload stored");

    let ops = cluster.connect_to(TEST_DB, "ops").await;
    let err = ops
        .batch_execute(
            "CREATE TEMP TABLE big AS SELECT jsonb_build_object('blob', repeat('x', 8000000)) AS p;
             SELECT lease.schedule('big', 'default', NULL, '1 hour', (SELECT p FROM big))",
        )
        .await
        .expect_err("a schedule's payload too");
    assert_eq!(sqlstate(&err).as_deref(), Some("22023"), "{err:?}");
}
