//! The install without the library (`bin/sql-install`, for managed
//! PostgreSQL): a database owner who is not a superuser runs it, the result
//! equals the extension's catalog except for the documented differences,
//! and its epochs stay failover-safe across a promotion without any C.
//!
//! Failed on main at bb69627, which had no `bin/sql-install`. Broken on
//! purpose (the stand-in `lease.epoch_floor()` answering 0): the first
//! claim's epoch was 1, not the timeline's floor.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use pg_tests::catalog::catalog;
use pg_tests::{pg_bin_dir, scalar, Cluster, SUPERUSER, TEST_DB};

/// The non-superuser that owns the database of the install.
const OWNER: &str = "sql_owner";
const DB: &str = "sql_install";

/// The library's functions: bin/sql-install replaces each by a stand-in.
const STAND_INS: &[&str] = &[
    "epoch_floor()",
    "_cron_next(",
    "_cron_last(",
    "_qualified_predicate(",
    "_reaper_touch()",
    "_reaper_discover()",
    "_reaper_slot_shortages()",
    "_reaper_last_slot_shortage()",
];

/// `bin/sql-install`'s script, from the extension script installed in the
/// server under test.
fn sql_install_script() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(root.join("bin/sql-install"))
        .env("PG_CONFIG", pg_bin_dir().join("pg_config"))
        .output()
        .expect("run bin/sql-install");
    assert!(
        out.status.success(),
        "bin/sql-install failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs `script` through psql as `user` in `db`, stopping at the first error.
fn psql_as(cluster: &Cluster, user: &str, db: &str, script: &str) {
    let mut child = Command::new(pg_bin_dir().join("psql"))
        .args(["-h", "127.0.0.1", "-p", &cluster.port().to_string()])
        .args([
            "-U",
            user,
            "-d",
            db,
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write script");
    let out = child.wait_with_output().expect("psql");
    assert!(
        out.status.success(),
        "psql as {user} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A catalog with the installing role's name made neutral, and without the
/// facts the two installs differ in by design: the stand-ins' bodies, event
/// triggers (superuser only) and pg_dump's extension tables.
fn comparable(lines: BTreeSet<String>, owner: &str) -> BTreeSet<String> {
    let role = regex_word(owner);
    lines
        .into_iter()
        .filter(|l| {
            !STAND_INS
                .iter()
                .any(|f| l.starts_with(&format!("function lease.{f}")))
        })
        .filter(|l| !l.starts_with("event trigger ") && !l.starts_with("dumped "))
        .map(|l| role(&l))
        .collect()
}

/// Replaces `word` where it stands as a role name in an ACL (`word=` or
/// `/word`), the only place the installing role appears.
fn regex_word(word: &str) -> impl Fn(&str) -> String + '_ {
    move |line: &str| {
        line.replace(&format!("{{{word}="), "{OWNER=")
            .replace(&format!(",{word}="), ",OWNER=")
            .replace(&format!("/{word}"), "/OWNER")
    }
}

#[tokio::test]
async fn a_database_owner_installs_without_the_library_and_gets_the_same_catalog() {
    let primary = Cluster::start();
    // The roles exist: the extension's install in TEST_DB created them.
    for statement in [
        format!("CREATE ROLE {OWNER} LOGIN"),
        format!("CREATE DATABASE {DB} OWNER {OWNER}"),
        format!("GRANT lease_admin TO {OWNER}"),
    ] {
        primary.psql(TEST_DB, &statement);
    }
    psql_as(&primary, OWNER, DB, &sql_install_script());

    let extension = comparable(catalog(&primary.connect().await).await, SUPERUSER);
    let owner = primary.connect_to(DB, OWNER).await;
    let sql_only = comparable(catalog(&owner).await, OWNER);
    let only = |a: &BTreeSet<String>, b: &BTreeSet<String>| {
        a.difference(b).cloned().collect::<Vec<_>>().join("\n")
    };
    assert!(
        extension == sql_only,
        "the installs differ\n--- only with the library:\n{}\n--- only without it:\n{}",
        only(&extension, &sql_only),
        only(&sql_only, &extension)
    );
    let c_functions: i64 = scalar(
        &owner,
        "SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
          WHERE p.pronamespace = 'lease'::regnamespace AND l.lanname = 'c'",
    )
    .await;
    assert_eq!(
        c_functions, 0,
        "a C function in the install without the library"
    );

    // The owner works the queue as the extension's users do; epochs carry
    // the timeline.
    owner
        .batch_execute(
            "SELECT lease.create_queue('jobs');
             SELECT lease.enqueue('jobs', '{}') FROM generate_series(1, 2)",
        )
        .await
        .expect("queue");
    let epoch: i64 = scalar(
        &owner,
        "SELECT epoch FROM lease.claim_pending(1, '1 minute', 'w', 'jobs')",
    )
    .await;
    assert_eq!(epoch, 1 << 40, "timeline 1");
    let cron = owner
        .execute(
            "SELECT lease.schedule('s', 'jobs', cron => '* * * * *')",
            &[],
        )
        .await
        .expect_err("cron needs the library");
    assert_eq!(pg_tests::sqlstate(&cron).as_deref(), Some("0A000"));

    // A promotion raises the floor: the next claim's epoch is above every
    // epoch the old primary could have issued.
    let standby = Cluster::start_standby(&primary, &[]);
    let replica = standby.connect_to(DB, OWNER).await;
    pg_tests::eventually(
        &replica,
        "SELECT count(*) = 1 FROM lease.job WHERE epoch > 0",
        std::time::Duration::from_secs(30),
    )
    .await;
    standby.promote();
    let promoted = standby.connect_to(DB, OWNER).await;
    let epoch: i64 = scalar(
        &promoted,
        "SELECT epoch FROM lease.claim_pending(1, '1 minute', 'w', 'jobs')",
    )
    .await;
    assert_eq!(epoch, 2 << 40, "timeline 2 after the promotion");
}
