//! A SQL-only demo: a throwaway PostgreSQL 15 with pg_lease preloaded,
//! several replicas sharing one queue through plain SQL, and a paused
//! replica (a zombie) whose late writes are fenced off.
//!
//! Run it with `cargo run -p pg_tests --example demo` once the extension is
//! installed. (`bin/demo`, the README's demo, runs the client's
//! `examples/replicas.rs` instead.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_tests::{scalar, Cluster, ClusterConfig};
use tokio_postgres::Client;

const REPLICAS: usize = 4;
const JOBS: i64 = 24;

fn say(who: &str, what: impl std::fmt::Display) {
    println!("  {who:<10} {what}");
}

/// One replica: claims up to two jobs at a time, "works" on each while its
/// lease stays renewed, records progress with a fenced write, then finishes.
async fn replica(client: Client, name: String, finished: Arc<AtomicUsize>) {
    loop {
        let rows = client
            .query(
                "SELECT id, epoch, payload->>'task' FROM lease.claim_pending(2, '2 seconds', $1, 'demo')",
                &[&name],
            )
            .await
            .expect("claim_pending");
        if rows.is_empty() {
            if finished.load(Ordering::SeqCst) as i64 >= JOBS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        for row in rows {
            let (id, epoch, task): (i64, i64, String) = (row.get(0), row.get(1), row.get(2));
            say(&name, format!("claimed #{id:<3} epoch {epoch}  {task}"));
            tokio::time::sleep(Duration::from_millis(120 + (id as u64 * 37) % 200)).await;
            let renewed: bool = client
                .query_one(
                    "SELECT held FROM lease.renew($1, $2, $3, '2 seconds')",
                    &[&id, &name, &epoch],
                )
                .await
                .expect("renew")
                .get(0);
            let wrote: bool = client
                .query_one(
                    "SELECT lease.fenced_update($1, $2, jsonb_build_object('done_by', $3::text))",
                    &[&id, &epoch, &name],
                )
                .await
                .expect("fenced_update")
                .get(0);
            let released: bool = client
                .query_one(
                    "SELECT lease.release($1, $2, $3, 'done')",
                    &[&id, &name, &epoch],
                )
                .await
                .expect("release")
                .get(0);
            if renewed && wrote && released {
                finished.fetch_add(1, Ordering::SeqCst);
                say(&name, format!("finished #{id}"));
            }
        }
    }
}

#[tokio::main]
async fn main() {
    println!("Starting a throwaway PostgreSQL 15 with shared_preload_libraries = 'pg_lease' ...");
    let cluster = Cluster::start_with(ClusterConfig {
        extra_conf: vec!["shared_preload_libraries = 'pg_lease'".into()],
        ..Default::default()
    });
    println!(
        "  listening on 127.0.0.1:{}, data in {}",
        cluster.port(),
        cluster.data_dir().display()
    );

    let admin = cluster.connect().await;
    admin
        .batch_execute(&format!(
            "SELECT lease.create_queue('demo', retention => '1 hour', backoff_base => '0', backoff_max => '0');
             SELECT lease.enqueue_batch('demo',
                 ARRAY(SELECT jsonb_build_object('task', 'resize photo ' || n) FROM generate_series(2, {JOBS}) n));
             SELECT lease.enqueue('demo', '{{\"task\": \"urgent: rotate photo 1\"}}', priority => 10);"
        ))
        .await
        .expect("set up the demo queue");

    println!("\n1. A zombie: replica Z claims the urgent job, then freezes past its 1 s lease.");
    let zombie = cluster.connect().await;
    let row = zombie
        .query_one(
            "SELECT id, epoch FROM lease.claim_pending(1, '1 second', 'Z', 'demo')",
            &[],
        )
        .await
        .expect("zombie claim");
    let (zid, zepoch): (i64, i64) = (row.get(0), row.get(1));
    say(
        "Z",
        format!("claimed #{zid} epoch {zepoch} ... and stops responding"),
    );
    // Nobody calls reap: the reaper inside PostgreSQL notices the expiry.
    let started = std::time::Instant::now();
    loop {
        let row = admin
            .query_one(
                "SELECT state::text, epoch, last_error FROM lease.job WHERE id = $1",
                &[&zid],
            )
            .await
            .expect("the zombie's job");
        let (state, epoch): (String, i64) = (row.get(0), row.get(1));
        if state == "pending" {
            let why: String = row.get(2);
            say(
                "reaper",
                format!(
                    "after {:.1} s: #{zid} is claimable again at epoch {epoch} ({why})",
                    started.elapsed().as_secs_f64()
                ),
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    println!("\n2. {REPLICAS} replicas share the {JOBS} jobs; none is done twice.");
    let finished = Arc::new(AtomicUsize::new(0));
    let mut replicas = Vec::new();
    for n in 1..=REPLICAS {
        let client = cluster.connect().await;
        replicas.push(tokio::spawn(replica(
            client,
            format!("replica-{n}"),
            Arc::clone(&finished),
        )));
    }

    // Let a replica take the zombie's job, then wake the zombie up.
    let holder = loop {
        let row = admin
            .query_one("SELECT owner, epoch FROM lease.job WHERE id = $1", &[&zid])
            .await
            .expect("who holds the zombie's job");
        let (owner, epoch): (String, i64) = (row.get(0), row.get(1));
        if owner != "Z" {
            break format!("{owner} holds #{zid} at epoch {epoch}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let wrote: bool = zombie
        .query_one(
            "SELECT lease.fenced_update($1, $2, '{\"done_by\": \"Z\"}')",
            &[&zid, &zepoch],
        )
        .await
        .expect("zombie write")
        .get(0);
    let released: bool = zombie
        .query_one(
            "SELECT lease.release($1, 'Z', $2, 'done')",
            &[&zid, &zepoch],
        )
        .await
        .expect("zombie release")
        .get(0);
    say(
        "Z",
        format!(
            "wakes up while {holder}: its fenced write is {}, its release is {} (epoch {zepoch} is stale)",
            if wrote { "ACCEPTED (bug!)" } else { "rejected" },
            if released {
                "ACCEPTED (bug!)"
            } else {
                "rejected"
            },
        ),
    );

    for r in replicas {
        r.await.expect("replica");
    }

    println!("\n3. Result");
    let rows = admin
        .query(
            "SELECT payload->>'done_by' AS replica, count(*) AS jobs, max(epoch) AS max_epoch
               FROM lease.job WHERE queue = 'demo' AND state = 'done'
              GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .expect("summary");
    for r in rows {
        let (who, jobs, max_epoch): (String, i64, i64) = (r.get(0), r.get(1), r.get(2));
        say(
            &who,
            format!("{jobs} jobs done (highest epoch {max_epoch})"),
        );
    }
    let done: i64 = scalar(
        &admin,
        "SELECT done FROM lease.queue_stats WHERE queue = 'demo'",
    )
    .await;
    let by_zombie: i64 = scalar(
        &admin,
        "SELECT count(*) FROM lease.job WHERE payload->>'done_by' = 'Z'",
    )
    .await;
    println!("\n  {done} of {JOBS} jobs done exactly once; writes by the zombie that landed: {by_zombie}.");
    println!("Stopping the throwaway cluster.");
}
