//! Leases on rows of the user's own tables (`lease.attach`), in the two
//! shapes real teams have: deferred deletions of `service_instances` rows in
//! status `SCHEDULED`, and `batch_items` in status `validating` that exactly
//! one processor may own. Several replicas share one database in each test.
//!
//! Each test was run once against code broken on purpose and failed; the
//! break is named in its doc comment ("Broken on purpose"). The same systems
//! beside the domain's other writers (acknowledgement consumers, users'
//! cancels) are in attach_writers.rs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pg_lease_client::{Outcome, Worker, WorkerConfig};
use pg_tests::service_instances::{self, delete_under_fence, publish_under_fence};
use pg_tests::workers::{spawn, stop};
use pg_tests::{eventually, scalar, sqlstate, Cluster, ClusterConfig};
use tokio::time::sleep;

/// A cluster whose reaper sweeps every 100 ms.
fn cluster_with_reaper() -> Cluster {
    Cluster::start_with(ClusterConfig::with_reaper(Duration::from_millis(100)))
}

/// Claims up to `limit` rows of `queue`: (id, key, epoch).
async fn claim(
    pg: &tokio_postgres::Client,
    limit: i32,
    ttl_ms: i64,
    owner: &str,
    queue: &str,
) -> Vec<(i64, String, i64)> {
    pg.query(
        "SELECT id, key, epoch FROM lease.claim_pending($1, $2::bigint * interval '1 millisecond', $3, $4)",
        &[&limit, &ttl_ms, &owner, &queue],
    )
    .await
    .expect("claim_pending")
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn worker_config(queue: &str, owner: &str, ttl: Duration) -> WorkerConfig {
    let mut c = WorkerConfig::new(queue).with_ttl(ttl);
    c.owner = owner.to_owned();
    c.poll_interval = Duration::from_millis(100);
    c
}

// ---- deferred deletions -------------------------------------------------------

/// Three replicas run the same `Worker` over the attached table: each
/// publishes a scheduled row (a fenced insert, with the attempt id as the
/// message id), keeps the lease while the broker's acknowledgement takes up
/// to 1.5 ttl to arrive, then deletes the row with a fenced write, which
/// finishes the lease. Every row is published exactly once, and rows not
/// scheduled are never touched.
///
/// Broken on purpose: with `lease.renew_batch` confirming leases without
/// extending them, slow acknowledgements let the reaper hand rows to other
/// replicas over and over, and the rows were not all deleted in 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deferred_deletions_are_published_once_and_held_until_the_ack() {
    const SCHEDULED: i64 = 120;
    let cluster = cluster_with_reaper();
    let pg = cluster.connect().await;
    service_instances::create(
        &pg,
        SCHEDULED,
        30,
        ", backoff_base => '0', backoff_max => '0'",
    )
    .await;

    let ttl = Duration::from_millis(800);
    let mut replicas = Vec::new();
    for n in 0..3u64 {
        let client = pg_tests::jobs::client(&cluster).await;
        let domain = Arc::new(cluster.connect().await);
        let worker = Worker::new(
            client,
            worker_config("service_instances", &format!("replica-{n}"), ttl),
            move |job| {
                let domain = Arc::clone(&domain);
                async move {
                    let key: i64 = job.lease().key().unwrap_or_default().parse()?;
                    publish_under_fence(&domain, key, &job).await?;
                    // The acknowledgement arrives asynchronously, sometimes
                    // well after the ttl; the worker renews meanwhile.
                    let wait = 200 + (key as u64 * 37) % 1000;
                    sleep(Duration::from_millis(wait)).await;
                    delete_under_fence(&domain, key, job.token()).await?;
                    Ok(Outcome::Released)
                }
            },
        );
        replicas.push(spawn(worker));
    }

    // Every scheduled row deleted.
    eventually(
        &pg,
        "SELECT count(*) = 0 FROM service_instances WHERE status = 'SCHEDULED'",
        Duration::from_secs(60),
    )
    .await;
    let mut done = 0;
    for (shutdown, run) in replicas {
        let summary = stop(shutdown, run).await;
        assert_eq!(summary.lost, 0, "{summary:?}");
        done += summary.done;
    }
    assert_eq!(done, SCHEDULED as u64);

    let per_instance: HashMap<i64, i64> = pg
        .query(
            "SELECT instance, count(*) FROM published GROUP BY instance",
            &[],
        )
        .await
        .expect("published")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let twice: Vec<_> = per_instance.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "published more than once: {twice:?}");
    assert_eq!(per_instance.len() as i64, SCHEDULED);
    assert_eq!(
        scalar::<i64>(
            &pg,
            "SELECT count(*) FROM service_instances WHERE status = 'RUNNING'"
        )
        .await,
        30
    );
    assert_eq!(
        scalar::<i64>(&pg, "SELECT count(*) FROM lease.job").await,
        0
    );
}

/// The broker never acknowledged: the row is retried.
async fn no_ack(pg: &tokio_postgres::Client, id: i64, epoch: i64) {
    pg.execute(
        "SELECT lease.release($1, 'replica', $2, 'retry', error => 'no ack')",
        &[&id, &epoch],
    )
    .await
    .expect("retry");
}

/// 150 scheduled rows whose acknowledgement never comes are retried at once
/// (no backoff: the harshest case), batch after batch of 100; rows
/// scheduled later are still each claimed within three batches, because a
/// retry moves a row's next-eligible time and claims order by it.
///
/// Broken on purpose: with `claim_pending` ordering by id only (oldest
/// first, as hand-written claims do), the new rows were never claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_rows_do_not_starve_newer_ones() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    service_instances::create(&pg, 150, 0, ", backoff_base => '0', backoff_max => '0'").await;

    let mut batches = 0;
    // Two rounds of unacknowledged work first: every old row has failed once.
    for _ in 0..2 {
        for (id, _, epoch) in claim(&pg, 100, 60_000, "replica", "service_instances").await {
            no_ack(&pg, id, epoch).await;
        }
        batches += 1;
    }
    pg.batch_execute(
        "INSERT INTO service_instances SELECT g, 'SCHEDULED' FROM generate_series(1001, 1010) g",
    )
    .await
    .expect("new rows");
    let mut fresh_seen = 0;
    for _ in 0..3 {
        for (id, key, epoch) in claim(&pg, 100, 60_000, "replica", "service_instances").await {
            if key.parse::<i64>().expect("key") > 1000 {
                fresh_seen += 1;
            }
            no_ack(&pg, id, epoch).await;
        }
        batches += 1;
        if fresh_seen == 10 {
            break;
        }
    }
    assert_eq!(
        fresh_seen, 10,
        "rows scheduled later starved behind 150 unacknowledged ones ({batches} batches)"
    );
}

/// A replica that shuts down early (its handlers waiting for
/// acknowledgements) gives its rows back at once: another replica finishes
/// them long before their 30 s leases would have expired, and the
/// interrupted attempts are not counted.
///
/// Broken on purpose: with `lease.release_batch` ignoring 'abandon', the
/// rows stayed leased to the departed replica (its summary: 9 lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_exits_early_leaves_nothing_stalled() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    service_instances::create(&pg, 10, 0, ", backoff_base => '0', backoff_max => '0'").await;
    let ttl = Duration::from_secs(30);

    let mut early = worker_config("service_instances", "early", ttl);
    early.concurrency = 10;
    early.grace_period = Duration::from_millis(100);
    let client = pg_tests::jobs::client(&cluster).await;
    let (shutdown, run) = spawn(Worker::new(client, early, |job| async move {
        // The acknowledgement never comes.
        job.cancelled().await;
        Ok(Outcome::Abandon)
    }));
    // The early replica holds all ten rows.
    eventually(
        &pg,
        "SELECT count(*) = 10 FROM lease.job WHERE state = 'leased' AND owner = 'early'",
        Duration::from_secs(10),
    )
    .await;
    let summary = stop(shutdown, run).await;
    assert_eq!(summary.abandoned, 10, "{summary:?}");

    let domain = Arc::new(cluster.connect().await);
    let client = pg_tests::jobs::client(&cluster).await;
    let (shutdown, run) = spawn(Worker::new(
        client,
        worker_config("service_instances", "late", ttl),
        move |job| {
            let domain = Arc::clone(&domain);
            async move {
                let key: i64 = job.lease().key().unwrap_or_default().parse()?;
                assert_eq!(job.lease().attempt(), 1, "the abandoned attempt counted");
                delete_under_fence(&domain, key, job.token()).await?;
                Ok(Outcome::Released)
            }
        },
    ));
    // The other replica finishes the rows well within their ttl.
    eventually(
        &pg,
        "SELECT count(*) = 0 FROM service_instances WHERE status = 'SCHEDULED'",
        Duration::from_secs(5),
    )
    .await;
    let summary = stop(shutdown, run).await;
    assert_eq!(summary.done, 10, "{summary:?}");
}

// ---- batch items --------------------------------------------------------------

async fn batch_items(pg: &tokio_postgres::Client, n: i64) {
    pg.batch_execute(&format!(
        "CREATE TABLE batch_items (
             id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
             status text NOT NULL DEFAULT 'validating',
             processor text,
             progress int NOT NULL DEFAULT 0);
         INSERT INTO batch_items (status) SELECT 'validating' FROM generate_series(1, {n});
         SELECT lease.attach('batch_items', pending => $$status = 'validating'$$,
                             backoff_base => '0', backoff_max => '0');"
    ))
    .await
    .expect("batch_items");
}

/// A fenced write to a batch item: `set` applies only while `(id, epoch)`
/// is the current lease; LE001 otherwise.
async fn fenced_item_write(
    pg: &tokio_postgres::Client,
    set: &str,
    key: &str,
    id: i64,
    epoch: i64,
) -> Result<u64, tokio_postgres::Error> {
    pg.execute(
        &format!(
            "UPDATE batch_items SET {set} WHERE id = $1::text::uuid AND lease.fence($2, $3) IS NOT NULL"
        ),
        &[&key, &id, &epoch],
    )
    .await
}

/// Processor A pauses past its lease (a zombie); the lease is reaped and B
/// takes the item over. A, awake again, can neither overwrite B's progress
/// nor finish the item — in one statement or in its own transaction — nor
/// renew or release; B's state survives and B finishes the item.
///
/// Broken on purpose: with `lease.fence` checking the id but not the epoch,
/// the zombie's write overwrote B's progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_processor_cannot_overwrite_the_new_owner() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    batch_items(&pg, 1).await;
    let a = cluster.connect().await;
    let b = cluster.connect().await;

    let Ok([(id, key, epoch_a)]) =
        <[_; 1]>::try_from(claim(&a, 1, 300, "proc-a", "batch_items").await)
    else {
        panic!("A claims the item");
    };
    fenced_item_write(&a, "processor = 'proc-a', progress = 1", &key, id, epoch_a)
        .await
        .expect("A's write while it holds the lease");

    // A pauses past its ttl; the lease is recovered and B takes over.
    sleep(Duration::from_millis(400)).await;
    scalar::<i64>(&pg, "SELECT count(*) FROM lease.reap()").await;
    let [(id_b, _, epoch_b)] = claim(&b, 1, 60_000, "proc-b", "batch_items").await[..] else {
        panic!("B claims the item");
    };
    assert_eq!(id_b, id);
    assert!(epoch_b > epoch_a);
    fenced_item_write(&b, "processor = 'proc-b', progress = 2", &key, id, epoch_b)
        .await
        .expect("B's write");

    // A wakes up.
    let err = fenced_item_write(&a, "processor = 'proc-a', progress = 99", &key, id, epoch_a)
        .await
        .expect_err("the zombie's write must fail");
    assert_eq!(sqlstate(&err).as_deref(), Some("LE001"));
    let in_tx = a
        .batch_execute(&format!(
            "BEGIN; SELECT lease.fence({id}, {epoch_a});
             UPDATE batch_items SET status = 'validated', processor = 'proc-a' WHERE id = '{key}';
             COMMIT;"
        ))
        .await
        .expect_err("the zombie's transaction must fail");
    assert_eq!(sqlstate(&in_tx).as_deref(), Some("LE001"));
    a.batch_execute("ROLLBACK").await.expect("rollback");
    let renewed: bool = a
        .query_one(
            "SELECT held FROM lease.renew($1, 'proc-a', $2, '1 minute')",
            &[&id, &epoch_a],
        )
        .await
        .expect("renew")
        .get(0);
    let released: bool = a
        .query_one("SELECT lease.release($1, 'proc-a', $2)", &[&id, &epoch_a])
        .await
        .expect("release")
        .get(0);
    assert!(!renewed && !released);

    let row = pg
        .query_one("SELECT status, processor, progress FROM batch_items", &[])
        .await
        .expect("item");
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, i32>(2)
        ),
        ("validating".into(), "proc-b".into(), 2)
    );
    // B finishes: the item leaves 'validating', which ends the lease.
    fenced_item_write(&b, "status = 'validated'", &key, id, epoch_b)
        .await
        .expect("B finishes");
    assert_eq!(
        scalar::<i64>(&pg, "SELECT count(*) FROM lease.job").await,
        0
    );
}

/// A cancel while an item is in progress ends as cancelled even though its
/// owner dies without a word: as a domain write (status 'cancelled', which
/// ends the lease at once) and as `lease.cancel` (the reaper ends the
/// expired lease as cancelled). Neither item is ever claimed again, and the
/// dead owner's token is refused.
///
/// Broken on purpose: with the attached-table trigger not ending the lease of
/// rows that stopped matching, the domain-cancelled item was reaped back to
/// pending and claimed by another processor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_in_progress_survives_the_owners_death() {
    let cluster = cluster_with_reaper();
    let pg = cluster.connect().await;
    batch_items(&pg, 2).await;
    let owner = cluster.connect().await;
    let items = claim(&owner, 2, 300, "doomed", "batch_items").await;
    let Ok([(id1, key1, e1), (id2, key2, e2)]) = <[_; 2]>::try_from(items) else {
        panic!("two items claimed");
    };
    pg.execute(
        "UPDATE batch_items SET status = 'cancelled' WHERE id = $1::text::uuid",
        &[&key1],
    )
    .await
    .expect("cancel in the domain");
    let asked: String = pg
        .query_one("SELECT lease.cancel($1)", &[&id2])
        .await
        .expect("lease.cancel")
        .get(0);
    assert_eq!(asked, "cancel_requested");
    // The owner dies: no renewal, no release. Its leases expire; the
    // reaper runs.
    drop(owner);
    // The reaper ends the lease of the cancel-requested item.
    eventually(
        &pg,
        "SELECT count(*) = 0 FROM lease.job WHERE state <> 'cancelled'",
        Duration::from_secs(10),
    )
    .await;

    let other = cluster.connect().await;
    assert!(claim(&other, 10, 60_000, "survivor", "batch_items")
        .await
        .is_empty());
    assert_eq!(
        scalar::<i64>(
            &pg,
            "SELECT count(*) FROM lease.job WHERE state = 'cancelled'"
        )
        .await,
        1
    );
    let status: String = pg
        .query_one(
            "SELECT status FROM batch_items WHERE id = $1::text::uuid",
            &[&key1],
        )
        .await
        .expect("item")
        .get(0);
    assert_eq!(status, "cancelled");
    for (id, key, epoch) in [(id1, &key1, e1), (id2, &key2, e2)] {
        let err = fenced_item_write(&other, "status = 'validated'", key, id, epoch)
            .await
            .expect_err("a dead owner's token is refused");
        assert_eq!(sqlstate(&err).as_deref(), Some("LE001"));
    }
}

/// A processor restarted under its stable name takes back its in-progress
/// items at once (`reclaim_own`, also through `WorkerConfig::reclaim_own`),
/// under new epochs that fence its earlier incarnation, without touching
/// another processor's items, and finishes them long before the old leases
/// would have expired.
///
/// Broken on purpose: with `lease.reclaim_own` keeping the epoch, the
/// earlier incarnation's token still renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_owner_recovers_its_own_items() {
    let cluster = Cluster::start();
    let pg = cluster.connect().await;
    batch_items(&pg, 8).await;
    let before = cluster.connect().await;
    let mine = claim(&before, 5, 60_000, "proc-1", "batch_items").await;
    let theirs = claim(&before, 3, 60_000, "proc-2", "batch_items").await;
    assert_eq!((mine.len(), theirs.len()), (5, 3));
    drop(before);

    // The restart: the same name, a fresh process with no tokens.
    let after = cluster.connect().await;
    let back: HashMap<i64, i64> = after
        .query(
            "SELECT id, epoch FROM lease.reclaim_own(2, '1 minute', 'proc-1', 'batch_items')",
            &[],
        )
        .await
        .expect("reclaim_own")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(back.len(), 2, "at most the limit");
    for (id, _, old_epoch) in &mine {
        let Some(new_epoch) = back.get(id) else {
            continue;
        };
        assert!(new_epoch > old_epoch);
        let held: bool = after
            .query_one(
                "SELECT held FROM lease.renew($1, 'proc-1', $2, '1 minute')",
                &[id, old_epoch],
            )
            .await
            .expect("renew")
            .get(0);
        assert!(
            !held,
            "the earlier incarnation's token {id}/{old_epoch} still holds"
        );
    }
    // The rest through the worker, which reclaims before claiming.
    let domain = Arc::new(cluster.connect().await);
    let mut config = worker_config("batch_items", "proc-1", Duration::from_secs(60));
    config.reclaim_own = true;
    let client = pg_tests::jobs::client(&cluster).await;
    let (shutdown, run) = spawn(Worker::new(client, config, move |job| {
        let domain = Arc::clone(&domain);
        async move {
            let token = job.token();
            let key = job.lease().key().unwrap_or_default().to_owned();
            fenced_item_write(&domain, "status = 'validated'", &key, token.id, token.epoch).await?;
            Ok(Outcome::Released)
        }
    }));
    // The restarted processor finishes its five items.
    eventually(
        &pg,
        "SELECT count(*) = 0 FROM lease.job WHERE owner = 'proc-1'",
        Duration::from_secs(5),
    )
    .await;
    stop(shutdown, run).await;
    let rows = pg
        .query(
            "SELECT owner, count(*) FROM lease.job GROUP BY owner ORDER BY owner",
            &[],
        )
        .await
        .expect("jobs");
    let left: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(left, vec![("proc-2".to_owned(), 3)]);
    assert_eq!(
        scalar::<i64>(
            &pg,
            "SELECT count(*) FROM batch_items WHERE status = 'validated'"
        )
        .await,
        5
    );
}
