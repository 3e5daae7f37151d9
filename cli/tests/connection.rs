//! Finding the database as every Postgres tool does (the libpq
//! environment), and saying so plainly when pg_lease is not in it.

mod common;

use std::process::Command;

use common::{assert_exit, pg_lease, stderr, url_as};
use pg_tests::pgbouncer::Bouncer;
use pg_tests::{Cluster, SUPERUSER, TEST_DB};

/// `PGHOST`, `PGPORT`, `PGUSER` and `PGDATABASE` alone name the database.
///
/// Failed before: without `--url`, `PG_LEASE_URL` or `DATABASE_URL`,
/// pg-lease exited 2 ("no database").
#[test]
fn the_libpq_environment_names_the_database() {
    let cluster = Cluster::start();
    let out = Command::new(env!("CARGO_BIN_EXE_pg-lease"))
        .env_remove("PG_LEASE_URL")
        .env_remove("DATABASE_URL")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cluster.port().to_string())
        .env("PGUSER", SUPERUSER)
        .env("PGDATABASE", TEST_DB)
        .args(["--json", "queues"])
        .output()
        .expect("run pg-lease");
    assert_exit(&out, 0);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"default\""),
        "{out:?}"
    );
}

/// Every command run in a database without pg_lease says so, exit 1.
///
/// Failed before: only `status` did; the others printed the server's
/// `schema "lease" does not exist` (3F000) or a missing relation (42P01).
#[test]
fn a_database_without_pg_lease_is_named_as_such() {
    let cluster = Cluster::start();
    cluster.psql(TEST_DB, "CREATE DATABASE bare");
    let url = url_as(&cluster, "bare", SUPERUSER);
    for args in [
        &["queues"][..],
        &["stats"],
        &["dead"],
        &["holders"],
        &["sweep"],
    ] {
        let out = pg_lease(&url, args);
        assert_exit(&out, 1);
        assert!(
            stderr(&out).contains("pg_lease is not installed in this database"),
            "{args:?}: {out:?}"
        );
    }
}

/// Through PgBouncer in transaction mode (1.18 here: it keeps no prepared
/// statements), every command works every time, and the pool's next client
/// finds no statement of pg-lease's left on its server connection.
///
/// Failed before: the second command exited 2 with `prepared statement "s1"
/// already exists` (42P05) reported as "could not connect", and so did
/// every later one; the CLI prepared its statements on a connection the
/// pooler hands to any transaction.
#[tokio::test]
async fn commands_work_through_a_transaction_pooler_and_leave_it_clean() {
    let cluster = Cluster::start();
    let bouncer = Bouncer::start(&cluster, &[]);
    let url = bouncer.conn_string(TEST_DB, SUPERUSER);
    for round in 0..3 {
        for args in [&["queues"][..], &["stats"], &["dead"], &["holders"]] {
            let out = pg_lease(&url, args);
            assert!(out.status.success(), "round {round}, {args:?}: {out:?}");
        }
    }
    // A client that prepares its statements, as the pool's next one.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect through the pooler");
    tokio::spawn(connection);
    for _ in 0..5 {
        let n: i64 = client
            .query_one("SELECT count(*) FROM lease.queue", &[])
            .await
            .expect("a prepared statement through the pooler")
            .get(0);
        assert_eq!(n, 1);
    }
}

/// A statement that fails is reported as that statement's failure, never
/// as a failed connection.
///
/// Failed before: the CLI opened its connection with a first statement
/// (reading `pg_available_extensions`) and reported any failure of it as
/// "could not connect", exit 2, here a role's missing read right on that
/// view, which no command needs.
#[test]
fn a_failing_statement_is_not_a_failed_connection() {
    let cluster = Cluster::start();
    cluster.psql(
        TEST_DB,
        "CREATE ROLE ops LOGIN IN ROLE lease_admin; \
         REVOKE SELECT ON pg_catalog.pg_available_extensions FROM PUBLIC",
    );
    let url = url_as(&cluster, TEST_DB, "ops");
    let out = pg_lease(&url, &["queues"]);
    assert_exit(&out, 0);
    assert!(!stderr(&out).contains("could not connect"), "{out:?}");
}
