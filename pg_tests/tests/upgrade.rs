//! `ALTER EXTENSION pg_lease UPDATE` from 0.1.0: held leases survive it, and
//! the upgraded catalog equals a fresh install of the current version.
//!
//! The 0.1.0 install script is kept in `extension/sql/` as the starting
//! point; `cargo pgrx install` copies it and the upgrade scripts beside the
//! current one. Any difference between the upgraded and the fresh catalog
//! fails the test and is printed, object by object.

use std::collections::BTreeSet;

use pg_tests::{scalar, Cluster, ClusterConfig};
use tokio_postgres::Client;

/// One line per catalog fact of schema `lease` and of what the extension
/// owns: functions (definition, security, settings, privileges, comment),
/// tables and views (columns, constraints, indexes, triggers, privileges,
/// comments), types, event triggers, and the tables pg_dump keeps.
const CATALOG: &str = r#"
WITH ns AS (SELECT 'lease'::regnamespace AS oid)
SELECT 'function ' || p.oid::regprocedure || ': ' || pg_get_functiondef(p.oid)
       || ' acl=' || coalesce(p.proacl::text, '-')
       || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '-')
  FROM pg_proc p, ns WHERE p.pronamespace = ns.oid
UNION ALL
SELECT 'relation ' || c.relname || ' kind=' || c.relkind::text || ' acl=' || coalesce(c.relacl::text, '-')
       || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '-')
       || CASE WHEN c.relkind = 'v' THEN ' view=' || pg_get_viewdef(c.oid) ELSE '' END
  FROM pg_class c, ns WHERE c.relnamespace = ns.oid
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || coalesce(' identity ' || nullif(a.attidentity::text, ''), '')
  FROM pg_class c JOIN ns ON c.relnamespace = ns.oid
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
UNION ALL
SELECT 'constraint ' || r.conrelid::regclass || ' ' || r.conname || ': ' || pg_get_constraintdef(r.oid)
  FROM pg_constraint r, ns WHERE r.connamespace = ns.oid
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN ns ON c.relnamespace = ns.oid
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN ns ON c.relnamespace = ns.oid
 WHERE NOT t.tgisinternal
UNION ALL
SELECT 'type ' || t.typname || ' ' || t.typtype::text || ' comment=' || coalesce(obj_description(t.oid, 'pg_type'), '-')
       || coalesce(' labels=' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                    FROM pg_enum e WHERE e.enumtypid = t.oid), '')
  FROM pg_type t, ns WHERE t.typnamespace = ns.oid AND t.typtype IN ('e', 'c')
   AND NOT EXISTS (SELECT FROM pg_class c WHERE c.reltype = t.oid AND c.relkind <> 'c')
UNION ALL
SELECT 'event trigger ' || e.evtname || ' ' || e.evtevent || ' ' || e.evtfoid::regproc
       || coalesce(' ' || e.evttags::text, '')
  FROM pg_event_trigger e
UNION ALL
SELECT 'dumped ' || c::regclass || coalesce(' ' || nullif(x.extcondition[i], ''), '')
  FROM pg_extension x, unnest(x.extconfig) WITH ORDINALITY AS u(c, i)
 WHERE x.extname = 'pg_lease'
UNION ALL
SELECT 'schema acl=' || coalesce(n.nspacl::text, '-') FROM pg_namespace n, ns WHERE n.oid = ns.oid
"#;

async fn catalog(client: &Client) -> BTreeSet<String> {
    client
        .query(CATALOG, &[])
        .await
        .expect("catalog")
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect()
}

/// Installs 0.1.0 with a held lease, a named lease and an attached table,
/// updates, and checks that the work goes on under the same tokens and that
/// the catalog is that of a fresh install.
#[tokio::test]
async fn an_update_from_0_1_0_keeps_leases_and_equals_a_fresh_install() {
    let cluster = Cluster::start_with(ClusterConfig {
        extra_conf: vec!["shared_preload_libraries = 'pg_lease'".into()],
        create_extension: false,
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
