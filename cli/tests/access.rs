//! Exit codes a script relies on, by who connects: a role without pg_lease
//! rights (1, SQLSTATE 42501), a `lease_admin` (the views yes, `jobs` no),
//! and connections that cannot be opened (2).

mod common;

use common::{assert_exit, pg_lease, pg_lease_json, stderr, stdout, url_as};
use pg_tests::{scalar, Cluster, TEST_DB};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_exit_1_with_their_sqlstate_and_no_connection_exits_2() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    pg.batch_execute(
        "CREATE ROLE nobody LOGIN;
         CREATE ROLE ops LOGIN IN ROLE lease_admin;
         SELECT lease.create_queue('emails');",
    )
    .await
    .expect("roles");
    let dead: i64 = scalar(
        &pg,
        "SELECT c.id FROM lease.enqueue('emails', '{}'),
                LATERAL lease.claim_pending(1, '1 minute', 'w', 'emails') c,
                LATERAL lease.release(c.id, 'w', c.epoch, 'fail') r",
    )
    .await;

    // No grant at all: every command is refused, nothing changes.
    let nobody = url_as(&cluster, TEST_DB, "nobody");
    for args in [
        &["status"][..],
        &["queues"],
        &["dead"],
        &["jobs", "list"],
        &["sweep"],
        &["requeue", &dead.to_string()],
    ] {
        let out = pg_lease(&nobody, args);
        assert_exit(&out, 1);
        assert!(
            stderr(&out).contains("(SQLSTATE 42501"),
            "{args:?}: {out:?}"
        );
        // The message names the grant that is missing, to the role that
        // connected (it said "GRANT lease_admin TO role" literally); `jobs`
        // needs the superuser.
        let needs = if args[0] == "jobs" {
            "only the superuser"
        } else {
            "GRANT lease_admin TO nobody"
        };
        assert!(stderr(&out).contains(needs), "{args:?}: {out:?}");
        assert!(stdout(&out).is_empty(), "{args:?}: {out:?}");
    }
    let state: String = scalar(
        &pg,
        &format!("SELECT state::text FROM lease.job WHERE id = {dead}"),
    )
    .await;
    assert_eq!(state, "dead", "the refused requeue changed nothing");

    lease_admin_may_read_the_views(&cluster, dead);
    nothing_tried_exits_2(&cluster);
}

/// lease_admin: the views and the functions, but not lease.job itself.
fn lease_admin_may_read_the_views(cluster: &Cluster, dead: i64) {
    let ops = url_as(cluster, TEST_DB, "ops");
    // status: everything, reaper health included (lease_admin may execute
    // the functions lease.reaper_stats calls).
    let status = pg_lease(&ops, &["--json", "status"]);
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    assert!(doc["queues"]
        .as_array()
        .is_some_and(|q| q.iter().any(|q| q["queue"] == "emails")));
    assert_eq!(doc["holders"], serde_json::json!([]));
    assert_exit(&status, 0);
    assert!(!doc["reaper"].is_null(), "{doc}");
    assert_eq!(doc["reaper_error"], serde_json::Value::Null);
    assert_eq!(pg_lease_json(&ops, &["dead"])[0]["id"], dead);
    let jobs = pg_lease(&ops, &["jobs", "show", &dead.to_string()]);
    assert_exit(&jobs, 1);
    assert!(stderr(&jobs).contains("only the superuser"), "{jobs:?}");
    assert!(stderr(&jobs).contains("SQLSTATE 42501"), "{jobs:?}");
    let requeued = pg_lease(&ops, &["requeue", &dead.to_string()]);
    assert_exit(&requeued, 0);
}

/// A role that does not exist, a database that does not exist, a server
/// that is not there, a string that is no connection string: exit 2.
fn nothing_tried_exits_2(cluster: &Cluster) {
    let port = cluster.port();
    for (url, said) in [
        (
            url_as(cluster, TEST_DB, "ghost"),
            format!("could not connect to 127.0.0.1:{port}"),
        ),
        (
            url_as(cluster, "nowhere", "nobody"),
            format!("could not connect to 127.0.0.1:{port}"),
        ),
        (
            "host=127.0.0.1 port=1 user=x dbname=x connect_timeout=5".to_owned(),
            "could not connect to 127.0.0.1:1".to_owned(),
        ),
        (
            "not a connection string".to_owned(),
            "bad connection string".to_owned(),
        ),
        (
            "host=127.0.0.1 port=notaport".to_owned(),
            "bad connection string".to_owned(),
        ),
    ] {
        for command in ["status", "install"] {
            let out = pg_lease(&url, &[command]);
            assert_exit(&out, 2);
            assert!(
                stderr(&out).starts_with(&format!("pg-lease: {said}")),
                "{url}: {out:?}"
            );
        }
    }
    let port_named = pg_lease("host=127.0.0.1 port=notaport", &["status"]);
    assert!(stderr(&port_named).contains("port"), "{port_named:?}");
    let ghost = pg_lease(&url_as(cluster, TEST_DB, "ghost"), &["status"]);
    assert!(stderr(&ghost).contains("SQLSTATE 28000"), "{ghost:?}");
}
