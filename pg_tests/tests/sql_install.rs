// pg_tests: library only: it makes the install without the library itself.
//! The install without the library (`bin/sql-install`, for managed
//! PostgreSQL): a database owner who is not a superuser runs it, the result
//! equals the extension's catalog except for the documented differences,
//! and its epochs stay failover-safe across a promotion without any C.
//!
//! Failed before `bin/sql-install` existed. Broken on
//! purpose (the stand-in `lease.epoch_floor()` answering 0): the first
//! claim's epoch was 1, not the timeline's floor.

use std::collections::BTreeSet;

use pg_tests::catalog::catalog;
use pg_tests::sql_install::install_as_owner;
use pg_tests::{scalar, Cluster, ClusterConfig, SUPERUSER};

/// The non-superuser that owns the database of the install.
const OWNER: &str = "sql_owner";
const DB: &str = "sql_install";

/// The library's functions: bin/sql-install replaces each by a stand-in.
const STAND_INS: &[&str] = &[
    "epoch_floor()",
    "_cron_next(",
    "_cron_last(",
    "_qualified_predicate(",
    "_reaper_touch(",
    "_reaper_discover()",
    "_reaper_wake()",
    "_reaper_slot_shortages()",
    "_reaper_last_slot_shortage()",
    "_own_transaction()",
    "_lock_table_rows(",
];

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
    install_as_owner(&primary, OWNER, DB);

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
    let standby = Cluster::start_standby(&primary, &ClusterConfig::default());
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
