// pg_tests: library only: it updates the extension from its previous version.
//! `ALTER EXTENSION pg_lease UPDATE` from 0.1.0: held leases survive it, and
//! the upgraded catalog equals a fresh install of the current version.
//!
//! The 0.1.0 install script is kept in `extension/sql/` as the starting
//! point; `cargo pgrx install` copies it and the upgrade scripts beside the
//! current one. Any difference between the upgraded and the fresh catalog
//! fails the test and is printed, object by object.

use pg_tests::catalog::catalog;
use pg_tests::{scalar, Cluster, ClusterConfig};

/// Installs 0.1.0 with a held lease, a named lease and an attached table,
/// updates, and checks that the work goes on under the same tokens and that
/// the catalog is that of a fresh install.
#[tokio::test]
async fn an_update_from_0_1_0_keeps_leases_and_equals_a_fresh_install() {
    let cluster = Cluster::start_with(ClusterConfig {
        extra_conf: vec!["shared_preload_libraries = 'pg_lease'".into()],
        create_extension: false,
        ..Default::default()
    });
    let pg = cluster.connect().await;
    // 0.1.0's attach never worked on PostgreSQL 16 and later (it relied on
    // how pg_get_viewdef printed views), so there the table is attached
    // after the update.
    let attach_before = pg_tests::server_major() < 16;
    pg.batch_execute(
        "CREATE EXTENSION pg_lease VERSION '0.1.0';
         SELECT lease.create_queue('jobs', max_attempts => 5);
         SELECT lease.enqueue('jobs', '{\"n\": 1}');
         CREATE TABLE items (id bigint PRIMARY KEY, status text);
         INSERT INTO items VALUES (1, 'todo'), (2, 'todo');",
    )
    .await
    .expect("0.1.0 with work in it");
    let attach = "SELECT lease.attach('items', $$status = 'todo'$$)";
    if attach_before {
        pg.batch_execute(attach).await.expect("attach on 0.1.0");
    }
    let held = |queue: &'static str| {
        let pg = &pg;
        async move {
            let row = pg
                .query_one(
                    "SELECT id, epoch FROM lease.claim_pending(1, '10 minutes', 'w', $1)",
                    &[&queue],
                )
                .await
                .expect("claim");
            (row.get::<_, i64>(0), row.get::<_, i64>(1))
        }
    };
    let (job, job_epoch) = held("jobs").await;
    let mut item = None;
    if attach_before {
        item = Some(held("items").await);
    }
    let named: i64 = scalar(&pg, "SELECT lease.try_acquire('leader', 'w', '10 minutes')").await;

    pg.batch_execute("ALTER EXTENSION pg_lease UPDATE")
        .await
        .expect("update");
    if !attach_before {
        pg.batch_execute(attach).await.expect("attach on 0.2.0");
        item = Some(held("items").await);
    }
    let (item, item_epoch) = item.expect("an item held");
    let version: String = scalar(
        &pg,
        "SELECT extversion FROM pg_extension WHERE extname = 'pg_lease'",
    )
    .await;
    assert_eq!(version, "0.2.0");

    // The work goes on under the same tokens.
    for (id, epoch) in [(job, job_epoch), (item, item_epoch)] {
        let renewed: bool = scalar(
            &pg,
            &format!("SELECT (lease.renew({id}, 'w', {epoch}, '1 minute')).held"),
        )
        .await;
        assert!(renewed, "lease {id}/{epoch} renews after the update");
    }
    assert!(
        scalar::<bool>(
            &pg,
            &format!("SELECT lease.fenced_update({job}, {job_epoch}, '{{\"x\": 1}}')")
        )
        .await
    );
    assert!(
        scalar::<bool>(
            &pg,
            &format!("SELECT lease.release({job}, 'w', {job_epoch})")
        )
        .await
    );
    let until: Option<String> = scalar(
        &pg,
        &format!("SELECT lease.renew_named('leader', 'w', {named}, '1 minute')::text"),
    )
    .await;
    assert!(until.is_some(), "the named lease renews");
    // The attached table works through the new triggers.
    pg.batch_execute(
        "INSERT INTO items VALUES (3, 'todo'); UPDATE items SET status = 'done' WHERE id = 1;",
    )
    .await
    .expect("domain writes");
    let keys: String = scalar(
        &pg,
        "SELECT string_agg(key, ',' ORDER BY key) FROM lease.job WHERE queue = 'items'",
    )
    .await;
    assert_eq!(keys, "2,3");

    // The catalog equals a fresh install's.
    pg.batch_execute("CREATE DATABASE fresh").await.expect("db");
    let fresh = cluster.connect_to("fresh", "postgres").await;
    fresh
        .batch_execute("CREATE EXTENSION pg_lease")
        .await
        .expect("fresh install");
    let upgraded = catalog(&pg).await;
    let installed = catalog(&fresh).await;
    let only_upgraded: Vec<_> = upgraded.difference(&installed).collect();
    let only_fresh: Vec<_> = installed.difference(&upgraded).collect();
    assert!(
        only_upgraded.is_empty() && only_fresh.is_empty(),
        "the upgraded catalog differs from a fresh install\n--- only after the update:\n{}\n--- only in a fresh install:\n{}",
        only_upgraded.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"),
        only_fresh.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n"),
    );
}
