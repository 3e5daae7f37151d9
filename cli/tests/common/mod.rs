//! Running the real `pg-lease` binary against a cluster of the harness.

#![allow(dead_code)] // each test file uses its own part

use std::process::{Command, Output};

use pg_tests::Cluster;

/// Runs `pg-lease --url URL ARGS...` with no connection variables from the
/// environment.
pub fn pg_lease(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pg-lease"))
        .env_remove("PG_LEASE_URL")
        .env_remove("DATABASE_URL")
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("run pg-lease")
}

/// Runs `pg-lease --json --url URL ARGS...`, asserts that it succeeded and
/// printed one JSON document, and returns it.
pub fn pg_lease_json(url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = pg_lease(url, &all);
    assert!(out.status.success(), "pg-lease {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("pg-lease {args:?} printed no JSON ({e}): {}", stdout(&out)))
}

/// Standard output as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the exit code, showing everything the command printed if not.
pub fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit code\n--- stdout\n{}--- stderr\n{}",
        stdout(out),
        stderr(out)
    );
}

/// A connection string for database `db` as `user` (trust auth), like the
/// harness's own for the superuser.
pub fn url_as(cluster: &Cluster, db: &str, user: &str) -> String {
    format!(
        "host=127.0.0.1 port={} user={user} dbname={db}",
        cluster.port()
    )
}

/// The cells of the table line of `out` that starts with `first`.
pub fn line_cells(out: &Output, first: &str) -> Vec<String> {
    let text = stdout(out);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no line for {first:?} in\n{text}"));
    line.split_whitespace().map(str::to_owned).collect()
}
pub mod browser;
pub mod http;
