//! `install` and `upgrade` against a real cluster: a database that has the
//! extension, one that does not, one at 0.1.0, and a role that may not.

mod common;

use common::{assert_exit, pg_lease, pg_lease_json, stderr, stdout, url_as};
use pg_tests::{scalar, Cluster, SUPERUSER, TEST_DB};
use serde_json::json;

async fn version_in(cluster: &Cluster, db: &str) -> Option<String> {
    let pg = cluster.connect_to(db, SUPERUSER).await;
    scalar(
        &pg,
        "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'pg_lease')",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_and_upgrade_say_what_they_did() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    // One statement each: CREATE DATABASE refuses a multi-statement batch.
    for sql in [
        "CREATE DATABASE fresh",
        "CREATE DATABASE old",
        "CREATE DATABASE locked",
        "CREATE ROLE nobody LOGIN",
    ] {
        pg.batch_execute(sql).await.expect(sql);
    }
    let newest = version_in(&cluster, TEST_DB).await.expect("installed");
    let url = cluster.conn_string(TEST_DB);

    // Already there: nothing to do, exit 0, for install and upgrade.
    let again = pg_lease(&url, &["install"]);
    assert_exit(&again, 0);
    assert!(stdout(&again).contains("already installed"), "{again:?}");
    let answer = pg_lease_json(&url, &["install"]);
    assert_eq!(
        answer,
        json!({"database": TEST_DB, "from": newest, "to": newest, "available": newest, "changed": false})
    );
    let current = pg_lease(&url, &["upgrade"]);
    assert_exit(&current, 0);
    assert!(stdout(&current).contains("is the newest the server offers; nothing done"));

    // A database without it: status and upgrade say so (exit 1), install
    // creates it.
    let fresh = url_as(&cluster, "fresh", SUPERUSER);
    let status = pg_lease(&fresh, &["status"]);
    assert_exit(&status, 1);
    assert!(
        stderr(&status).contains("not installed in this database"),
        "{status:?}"
    );
    let upgrade = pg_lease(&fresh, &["upgrade"]);
    assert_exit(&upgrade, 1);
    assert!(stderr(&upgrade).contains("pg-lease install"), "{upgrade:?}");
    let installed = pg_lease_json(&fresh, &["install"]);
    assert_eq!(installed["from"], serde_json::Value::Null);
    assert_eq!(installed["to"], newest.as_str());
    assert_eq!(installed["changed"], true);
    assert_eq!(
        version_in(&cluster, "fresh").await.as_deref(),
        Some(newest.as_str())
    );
    assert_exit(&pg_lease(&fresh, &["status"]), 0);

    // From 0.1.0, when its script is on the server (bin/test installs it;
    // `cargo pgrx install` alone does not).
    let has_0_1_0: bool = scalar(
        &pg,
        "SELECT EXISTS (SELECT FROM pg_available_extension_versions
                         WHERE name = 'pg_lease' AND version = '0.1.0')",
    )
    .await;
    if has_0_1_0 {
        upgrade_from_0_1_0(&cluster, &newest).await;
    } else {
        eprintln!("skipped the upgrade from 0.1.0: its install script is not on the server");
    }

    // A role without rights cannot install: exit 1, 42501, nothing created.
    let refused = pg_lease(&url_as(&cluster, "locked", "nobody"), &["install"]);
    assert_exit(&refused, 1);
    assert!(
        stderr(&refused).contains("cannot create pg_lease"),
        "{refused:?}"
    );
    assert!(
        stderr(&refused).contains("needs the superuser"),
        "{refused:?}"
    );
    assert!(stderr(&refused).contains("SQLSTATE 42501"), "{refused:?}");
    assert_eq!(version_in(&cluster, "locked").await, None);
}

/// The role without rights is refused, the superuser updates and is told
/// from and to.
async fn upgrade_from_0_1_0(cluster: &Cluster, newest: &str) {
    cluster
        .connect_to("old", SUPERUSER)
        .await
        .batch_execute("CREATE EXTENSION pg_lease VERSION '0.1.0'")
        .await
        .expect("0.1.0");
    let denied = pg_lease(&url_as(cluster, "old", "nobody"), &["upgrade"]);
    assert_exit(&denied, 1);
    assert!(
        stderr(&denied).contains("cannot update pg_lease"),
        "{denied:?}"
    );
    assert!(stderr(&denied).contains("SQLSTATE 42501"), "{denied:?}");
    assert_eq!(version_in(cluster, "old").await.as_deref(), Some("0.1.0"));
    let old = url_as(cluster, "old", SUPERUSER);
    let upgraded = pg_lease(&old, &["upgrade"]);
    assert_exit(&upgraded, 0);
    assert_eq!(
        stdout(&upgraded),
        format!("pg_lease 0.1.0 → {newest} in database \"old\"\n")
    );
    assert_eq!(version_in(cluster, "old").await.as_deref(), Some(newest));
}
