// pg_tests: library only: it makes the install without the library itself, where pg_cron runs.
//! Recovery without pg_lease's background worker, the managed way: the
//! install without the library, run by a database owner who is not a
//! superuser, and pg_cron calling `lease.sweep()` as that owner. Expired
//! leases stay expired until the cron job runs (so the test fails with it
//! off), then are recovered by it.
//!
//! Needs pg_cron for the server under test (Debian's postgresql-15-cron,
//! 1.4: a minute is its shortest schedule, so this test takes up to about
//! a minute). Hence ignored by default: `bin/test` runs it (`--ignored`)
//! where the server has pg_cron and reports it SKIPPED where it has none
//! (the PostgreSQL 18 wheel). Failed before the install without the
//! library existed.

use std::process::Command;
use std::time::Duration;

use pg_tests::sql_install::install_as_owner;
use pg_tests::{eventually, pg_bin_dir, scalar, Cluster, ClusterConfig};

const OWNER: &str = "cron_owner";
const DB: &str = "cron_app";

fn has_pg_cron() -> bool {
    Command::new(pg_bin_dir().join("pg_config"))
        .arg("--pkglibdir")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .is_some_and(|dir| std::path::Path::new(&dir).join("pg_cron.so").exists())
}

#[tokio::test]
#[ignore = "needs pg_cron for the server under test: bin/test runs it where there is one"]
async fn pg_cron_sweeping_as_the_owner_recovers_expired_leases() {
    assert!(
        has_pg_cron(),
        "no pg_cron for the server under test: this test cannot run here"
    );
    let cluster = Cluster::start_with(ClusterConfig {
        extra_conf: vec![
            "shared_preload_libraries = 'pg_cron'".into(),
            format!("cron.database_name = '{}'", pg_tests::TEST_DB),
            // Jobs run in background workers, not over a libpq connection.
            "cron.use_background_workers = on".into(),
        ],
        // No CREATE EXTENSION pg_lease anywhere: the library is never loaded.
        create_extension: false,
        ..Default::default()
    });
    cluster.psql(pg_tests::TEST_DB, "CREATE EXTENSION pg_cron");
    install_as_owner(&cluster, OWNER, DB);

    let owner = cluster.connect_to(DB, OWNER).await;
    owner
        .batch_execute(
            "SELECT lease.create_queue('jobs');
             SELECT lease.enqueue('jobs', '{}') FROM generate_series(1, 3);
             SELECT count(*) FROM lease.claim_pending(3, '100 milliseconds', 'crashed', 'jobs');",
        )
        .await
        .expect("queue, rows, leases");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let expired: i64 = scalar(
        &owner,
        "SELECT count(*) FROM lease.job WHERE state = 'leased' AND lease_until < clock_timestamp()",
    )
    .await;
    assert_eq!(expired, 3, "nothing recovers them before the cron job runs");

    cluster.psql(
        pg_tests::TEST_DB,
        &format!(
            "SELECT cron.schedule_in_database('pg_lease sweep', '* * * * *', 'SELECT lease.sweep()',
                                              '{DB}', '{OWNER}')"
        ),
    );
    eventually(
        &owner,
        "SELECT count(*) = 0 FROM lease.job WHERE state = 'leased'",
        Duration::from_secs(90),
    )
    .await;
    let swept: i64 = scalar(&owner, "SELECT sweeps FROM lease.sweep_state").await;
    assert!(swept >= 1, "the cron job's sweeps are counted");
}
