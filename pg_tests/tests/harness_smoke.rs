// pg_tests: library only: it checks the harness, whatever the install.
//! Checks the harness itself: a cluster starts, answers queries, is
//! the PostgreSQL under test, and leaves neither a server process nor a data directory
//! behind when dropped. Does not need the pg_lease extension.

use std::fs;

use pg_tests::{process_alive, Cluster, ClusterConfig, TEST_DB};

/// Pid of the postmaster, from the first line of `postmaster.pid`.
fn postmaster_pid(cluster: &Cluster) -> u32 {
    let pid_file = fs::read_to_string(cluster.data_dir().join("postmaster.pid"))
        .expect("a running cluster has a postmaster.pid");
    pid_file
        .lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .expect("postmaster.pid starts with the postmaster's pid")
}

#[tokio::test]
async fn cluster_starts_answers_and_cleans_up() {
    let cluster = Cluster::start_with(ClusterConfig {
        create_extension: false,
        ..Default::default()
    });
    let data_dir = cluster.data_dir().to_path_buf();
    assert!(data_dir.join("PG_VERSION").is_file());
    let pid = postmaster_pid(&cluster);
    assert!(process_alive(pid), "postmaster {pid} should be running");

    {
        let client = cluster.connect().await;
        let one: i32 = client
            .query_one("SELECT 1", &[])
            .await
            .expect("SELECT 1")
            .get(0);
        assert_eq!(one, 1);

        let version: String = client
            .query_one("SHOW server_version", &[])
            .await
            .expect("SHOW server_version")
            .get(0);
        let major = pg_tests::server_major();
        assert!(
            version.starts_with(&format!("{major}.")),
            "expected PostgreSQL {major}, got {version}"
        );

        let (db, user, port): (String, String, i32) = {
            let row = client
                .query_one(
                    "SELECT current_database()::text, current_user::text, \
                     current_setting('port')::int",
                    &[],
                )
                .await
                .expect("connection facts");
            (row.get(0), row.get(1), row.get(2))
        };
        assert_eq!(db, TEST_DB);
        assert_eq!(user, "postgres");
        assert_eq!(port, i32::from(cluster.port()));
    }

    // The synchronous psql helper and the server log work too.
    assert_eq!(cluster.psql("postgres", "SELECT 40 + 2").trim(), "42");
    assert!(
        cluster
            .server_log()
            .contains("database system is ready to accept connections"),
        "server.log:\n{}",
        cluster.server_log()
    );

    drop(cluster);
    assert!(
        !data_dir.exists(),
        "{} should be removed",
        data_dir.display()
    );
    assert!(!process_alive(pid), "postmaster {pid} should have exited");
}

#[tokio::test]
async fn clusters_are_independent() {
    let config = ClusterConfig {
        create_extension: false,
        extra_conf: vec!["application_name = 'harness_smoke'".into()],
        ..Default::default()
    };
    let a = Cluster::start_with(config.clone());
    let b = Cluster::start_with(config);
    assert_ne!(a.port(), b.port());
    assert_ne!(a.data_dir(), b.data_dir());

    let client_a = a.connect().await;
    client_a
        .batch_execute("CREATE TABLE only_in_a (x int)")
        .await
        .expect("create table in a");
    let client_b = b.connect_to("postgres", "postgres").await;
    let found: i64 = client_b
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&TEST_DB],
        )
        .await
        .expect("query b")
        .get(0);
    assert_eq!(found, 1, "b has its own {TEST_DB}");
    assert_eq!(
        b.psql(TEST_DB, "SELECT to_regclass('only_in_a') IS NULL")
            .trim(),
        "t"
    );
    // extra_conf lines reach postgresql.conf.
    let app: String = client_b
        .query_one("SELECT current_setting('application_name')", &[])
        .await
        .expect("application_name")
        .get(0);
    assert_eq!(app, "harness_smoke");
}
