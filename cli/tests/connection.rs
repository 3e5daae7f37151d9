//! Finding the database as every Postgres tool does (the libpq
//! environment), and saying so plainly when pg_lease is not in it.

mod common;

use std::process::Command;

use common::{assert_exit, pg_lease, stderr, url_as};
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
