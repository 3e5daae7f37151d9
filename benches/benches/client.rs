//! Latency of single calls through the Rust client (`pg_lease_client`):
//! claim, renew, release, fenced update, each one round trip and one
//! commit, on a throwaway cluster with the benchmark settings
//! (`pg_lease_benches::SETTINGS`: fsync and synchronous_commit on).
//!
//! `cargo bench -p pg_lease_benches --bench client` (the extension must be
//! installed). Sample sizes are small: the machine has 2 cores and every
//! sample commits.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pg_lease_client::{BatchOptions, Client, FencingToken, Lease, Outcome};
use tokio::runtime::Runtime;

const QUEUE: &str = "crit";
const OWNER: &str = "criterion";
const TTL: Duration = Duration::from_secs(300);

/// Enqueues `n` rows, `chunk` at a time.
async fn enqueue(client: &Client, n: u64) {
    let mut left = n;
    while left > 0 {
        let chunk = left.min(10_000) as usize;
        let payloads = vec![serde_json::json!({ "n": 1 }); chunk];
        client
            .enqueue_batch(QUEUE, &payloads, &BatchOptions::default())
            .await
            .expect("enqueue_batch");
        left -= chunk as u64;
    }
}

/// Claims `n` rows (in calls of at most 10,000) and returns their leases.
async fn claim(client: &Client, n: u64) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(n as usize);
    while (leases.len() as u64) < n {
        let want = (n - leases.len() as u64).min(10_000) as u32;
        let got = client.claim(want, TTL, OWNER, QUEUE).await.expect("claim");
        assert!(!got.is_empty(), "queue {QUEUE} ran dry");
        leases.extend(got.into_iter().map(|c| c.lease));
    }
    leases
}

/// Completes `leases` (untimed clean-up), 10,000 per call.
async fn done(client: &Client, leases: &[Lease]) {
    for chunk in leases.chunks(10_000) {
        let tokens: Vec<FencingToken> = chunk.iter().map(Lease::token).collect();
        client
            .release_batch(OWNER, &tokens, QUEUE, &Outcome::Done)
            .await
            .expect("release_batch");
    }
}

fn client_calls(c: &mut Criterion) {
    let cluster = pg_lease_benches::start_cluster();
    let rt = Runtime::new().expect("tokio runtime");
    let client = rt
        .block_on(Client::connect(&cluster.conn_string(pg_tests::TEST_DB)))
        .expect("connect");
    rt.block_on(client.create_queue(QUEUE, &Default::default()))
        .expect("create_queue");

    let mut g = c.benchmark_group("client");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    for batch in [1_u32, 50] {
        g.bench_function(format!("claim/{batch}"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    enqueue(&client, iters * u64::from(batch)).await;
                    let mut leases = Vec::new();
                    let started = Instant::now();
                    for _ in 0..iters {
                        let got = client.claim(batch, TTL, OWNER, QUEUE).await.expect("claim");
                        leases.extend(got.into_iter().map(|c| c.lease));
                    }
                    let elapsed = started.elapsed();
                    done(&client, &leases).await;
                    elapsed
                })
            })
        });
    }

    g.bench_function("release/1", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                enqueue(&client, iters).await;
                let leases = claim(&client, iters).await;
                let started = Instant::now();
                for lease in &leases {
                    client
                        .release(lease, &Outcome::Done)
                        .await
                        .expect("release");
                }
                started.elapsed()
            })
        })
    });

    g.bench_function("release_batch/50", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                enqueue(&client, iters * 50).await;
                let leases = claim(&client, iters * 50).await;
                let started = Instant::now();
                for chunk in leases.chunks(50) {
                    let tokens: Vec<FencingToken> = chunk.iter().map(Lease::token).collect();
                    client
                        .release_batch(OWNER, &tokens, QUEUE, &Outcome::Done)
                        .await
                        .expect("release_batch");
                }
                started.elapsed()
            })
        })
    });

    // One lease held for the renew and fenced-update benchmarks.
    let held = rt.block_on(async {
        enqueue(&client, 50).await;
        claim(&client, 50).await
    });
    g.bench_function("renew/1", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let started = Instant::now();
                for _ in 0..iters {
                    client.renew(&held[0], TTL).await.expect("renew");
                }
                started.elapsed()
            })
        })
    });
    g.bench_function("renew_batch/50", |b| {
        let tokens: Vec<FencingToken> = held.iter().map(Lease::token).collect();
        b.iter_custom(|iters| {
            rt.block_on(async {
                let started = Instant::now();
                for _ in 0..iters {
                    client
                        .renew_batch(OWNER, &tokens, QUEUE, TTL)
                        .await
                        .expect("renew_batch");
                }
                started.elapsed()
            })
        })
    });
    g.bench_function("fenced_update/1", |b| {
        let patch = serde_json::json!({ "progress": 1 });
        b.iter_custom(|iters| {
            rt.block_on(async {
                let started = Instant::now();
                for _ in 0..iters {
                    client
                        .fenced_update(held[0].token(), &patch)
                        .await
                        .expect("fenced_update");
                }
                started.elapsed()
            })
        })
    });
    g.finish();
    rt.block_on(done(&client, &held));
    drop(client);
    drop(rt);
    drop(cluster);
}

criterion_group!(benches, client_calls);
criterion_main!(benches);
