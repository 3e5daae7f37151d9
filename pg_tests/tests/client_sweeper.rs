//! The client's [`Sweeper`], for servers without the background reaper:
//! expired leases stay expired while no sweeper runs (so the test would
//! fail with the sweeper off), are recovered once one runs, only the
//! holder of the sweeper's named lease sweeps, and a sweep under a stale
//! epoch is refused.
//!
//! Failed before the `Sweeper` existed. Broken on purpose
//! (the Sweeper's loop not calling `sweep_fenced`): the expired leases were
//! still leased after 10 s.

use std::time::Duration;

use pg_lease_client::{Client, ElectorConfig, Error, Sweeper, SweeperConfig};
use pg_tests::{eventually, scalar, Cluster, TEST_DB};

const NAME: &str = "pg_lease sweeper";

fn config(owner: &str) -> SweeperConfig {
    let mut elector = ElectorConfig::new(NAME).with_ttl(Duration::from_secs(2));
    elector.owner = owner.to_owned();
    SweeperConfig {
        elector,
        every: Duration::from_millis(100),
        ..SweeperConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_sweeps_under_its_epoch_and_recovers_expired_leases() {
    // Not preloaded: nothing recovers an expired lease by itself.
    let cluster = Cluster::start();
    let conn = cluster.conn_string(TEST_DB);
    let client = Client::connect(&conn).await.expect("client");
    let pg = cluster.connect().await;
    client
        .create_queue("jobs", &Default::default())
        .await
        .expect("queue");
    for _ in 0..5 {
        client
            .enqueue("jobs", &serde_json::json!({}))
            .await
            .expect("enqueue");
    }
    let claimed = client
        .claim(5, Duration::from_millis(200), "crashed", "jobs")
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 5);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let expired =
        "SELECT count(*) FROM lease.job WHERE state = 'leased' AND lease_until < clock_timestamp()";
    assert_eq!(
        scalar::<i64>(&pg, expired).await,
        5,
        "no sweeper, no recovery"
    );

    let a = Sweeper::start(Client::connect(&conn).await.expect("client a"), config("a"))
        .expect("sweeper a");
    eventually(
        &pg,
        "SELECT count(*) = 0 FROM lease.job WHERE state = 'leased'",
        Duration::from_secs(10),
    )
    .await;
    let b = Sweeper::start(Client::connect(&conn).await.expect("client b"), config("b"))
        .expect("sweeper b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let holder = format!("SELECT owner FROM lease.holders WHERE name = '{NAME}'");
    assert_eq!(
        scalar::<String>(&pg, &holder).await,
        "a",
        "the first sweeper still leads"
    );
    let a_epoch: i64 = scalar(
        &pg,
        &format!("SELECT epoch FROM lease.holders WHERE name = '{NAME}'"),
    )
    .await;

    // a stops and hands over; b sweeps from then on.
    a.stop().await;
    eventually(
        &pg,
        &format!(
            "SELECT coalesce(bool_or(owner = 'b'), false) FROM lease.holders WHERE name = '{NAME}'"
        ),
        Duration::from_secs(10),
    )
    .await;
    let sweeps = "SELECT sweeps FROM lease.sweep_state";
    let before: i64 = scalar(&pg, sweeps).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(scalar::<i64>(&pg, sweeps).await > before, "b sweeps");

    // A sweep under a's old epoch changes nothing.
    match client.sweep_fenced(NAME, a_epoch, 100).await {
        Err(Error::NamedLeaseLost { epoch, .. }) => assert_eq!(epoch, a_epoch),
        other => panic!("a stale sweep was not refused: {other:?}"),
    }
    b.stop().await;
}
