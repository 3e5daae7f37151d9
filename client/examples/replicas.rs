//! Replicas sharing a queue, as separate OS processes.
//!
//! ```sh
//! cargo run -p pg_lease_client --example replicas -- "host=127.0.0.1 user=postgres dbname=app"
//! ```
//!
//! (or set `PG_LEASE_URL`; the role needs `lease_admin`, the database the
//! extension). Without either, it starts a throwaway PostgreSQL 15 cluster
//! with pg_lease preloaded (the extension must be installed; the test
//! harness in `pg_tests` does this) and deletes it at the end. The orchestrator (this process) fills queue `replicas` with 40 jobs,
//! starts three replica processes (this program again, with `replica
//! NAME`), and then:
//!
//! 1. plays a zombie: claims a job with a 1 s lease, freezes for 2 s, and
//!    wakes up after a replica took the job over: its fenced write and its
//!    release are rejected;
//! 2. kills replica-2 (SIGKILL) in the middle of its work: its leases
//!    expire, are reaped, and the other replicas finish its jobs;
//! 3. closes the survivors' stdin (their signal to shut down gracefully)
//!    once every job is done, and prints who did what.
//!
//! Expired leases are recovered by the extension's background reaper when
//! `shared_preload_libraries` includes `pg_lease`; otherwise the
//! orchestrator calls `lease.reap()` every half second in its place.

use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use pg_lease_client::{
    BatchOptions, CancellationToken, Client, Outcome, QueueOptions, Worker, WorkerConfig,
};
use serde_json::json;
use tokio::process::{Child, Command};

const QUEUE: &str = "replicas";
const JOBS: usize = 40;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [mode, name, rest @ ..] if mode == "replica" => {
            let conn = conn_string(rest).ok_or("pass a connection string")?;
            replica(name, &conn).await
        }
        rest => match conn_string(rest) {
            Some(conn) => orchestrate(&conn).await,
            None => {
                println!("Starting a throwaway PostgreSQL 15 with shared_preload_libraries = 'pg_lease' ...");
                let cluster = pg_tests::Cluster::start_with(pg_tests::ClusterConfig {
                    extra_conf: vec!["shared_preload_libraries = 'pg_lease'".into()],
                    ..Default::default()
                });
                orchestrate(&cluster.conn_string(pg_tests::TEST_DB)).await
            }
        },
    }
}

/// The first argument, else `PG_LEASE_URL`.
fn conn_string(args: &[String]) -> Option<String> {
    args.first()
        .cloned()
        .or_else(|| std::env::var("PG_LEASE_URL").ok())
}

fn say(who: &str, what: impl std::fmt::Display) {
    println!("  {who:<10} {what}");
}

/// One replica: a worker with two slots and a 2 s lease. Each job "works"
/// for the time in its payload, then stamps `done_by` with a fenced write.
async fn replica(name: &str, conn: &str) -> Result<(), BoxError> {
    let client = Client::connect(conn).await?;
    let mut config = WorkerConfig::new(QUEUE).with_ttl(Duration::from_secs(2));
    config.owner = name.to_owned();
    config.concurrency = 2;
    config.grace_period = Duration::from_secs(5);
    let me = name.to_owned();
    let worker = Worker::new(client, config, move |job| {
        let me = me.clone();
        async move {
            let lease = job.lease();
            let task = job.payload()["task"].as_str().unwrap_or("?").to_owned();
            let work = Duration::from_millis(job.payload()["ms"].as_u64().unwrap_or(500));
            say(
                &me,
                format!("claimed  #{:<3} {} {task}", lease.id(), job.attempt_id()),
            );
            tokio::select! {
                () = tokio::time::sleep(work) => {}
                () = job.cancelled() => return Ok(Outcome::Abandon),
            }
            job.fenced_update(&json!({ "done_by": me, "attempt_id": job.attempt_id() }))
                .await?;
            say(&me, format!("finished #{}", lease.id()));
            Ok(Outcome::Done)
        }
    });

    // The orchestrator closes our stdin to ask for a graceful shutdown.
    let shutdown = CancellationToken::new();
    let on_eof = shutdown.clone();
    std::thread::spawn(move || {
        for _ in std::io::stdin().lock().lines() {}
        on_eof.cancel();
    });
    let summary = worker.run(shutdown).await?;
    say(
        name,
        format!(
            "stopped: {} claimed, {} done, {} abandoned",
            summary.claimed, summary.done, summary.abandoned
        ),
    );
    Ok(())
}

async fn orchestrate(conn: &str) -> Result<(), BoxError> {
    let admin = Client::connect(conn).await?;
    let _ = admin.drop_queue(QUEUE, true).await; // a previous run's leftovers
    admin
        .create_queue(
            QUEUE,
            &QueueOptions {
                retention: Duration::from_secs(3600),
                backoff_base: Duration::ZERO,
                backoff_max: Duration::ZERO,
                ..QueueOptions::default()
            },
        )
        .await?;
    let payloads: Vec<_> = (1..=JOBS)
        .map(|n| json!({ "task": format!("resize photo {n}"), "ms": 400 + (n * 137) % 600 }))
        .collect();
    admin
        .enqueue_batch(QUEUE, &payloads, &BatchOptions::default())
        .await?;
    println!("Queue '{QUEUE}' holds {JOBS} jobs.");

    let reaper = CancellationToken::new();
    if !reaper_preloaded(conn).await? {
        println!("(pg_lease is not preloaded: this process calls lease.reap() every 0.5 s instead of its background reaper)");
        let (admin, stop) = (admin.clone(), reaper.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let _ = admin.reap(1000).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    println!("\n1. A zombie claims a job with a 1 s lease and freezes for 2 s.");
    let zombie = admin
        .claim(1, Duration::from_secs(1), "zombie", QUEUE)
        .await?
        .pop()
        .ok_or("no job for the zombie")?;
    let zlease = zombie.lease;
    say(
        "zombie",
        format!("claimed  #{} {}", zlease.id(), zlease.attempt_id()),
    );

    println!("\n2. Three replicas (separate processes) share the queue.");
    let exe = std::env::current_exe()?;
    let mut replicas = Vec::new();
    for n in 1..=3 {
        let child = Command::new(&exe)
            .args(["replica", &format!("replica-{n}"), conn])
            .stdin(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        replicas.push((format!("replica-{n}"), child));
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let wrote = admin
        .fenced_update(zlease.token(), &json!({ "done_by": "zombie" }))
        .await;
    let released = admin.release(&zlease, &Outcome::Done).await;
    say(
        "zombie",
        format!(
            "wakes up: fenced write {}, release {}",
            verdict(&wrote),
            verdict(&released)
        ),
    );

    println!("\n3. replica-2 is killed (SIGKILL) in the middle of its work.");
    kill(&mut replicas[1].1).await?;
    say(
        "replica-2",
        "killed; its leases will expire and be recovered",
    );

    while done(&admin).await? < JOBS as i64 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("\n4. All jobs done; the surviving replicas shut down gracefully.");
    for (_, child) in &mut replicas {
        drop(child.stdin.take()); // EOF: graceful shutdown
    }
    for (_, child) in &mut replicas {
        child.wait().await?;
    }
    reaper.cancel();

    println!("\nResult");
    report(conn, &zlease).await?;
    Ok(())
}

fn verdict<T>(r: &Result<T, pg_lease_client::Error>) -> &'static str {
    match r {
        Ok(_) => "ACCEPTED (bug!)",
        Err(e) if e.is_lease_lost() => "rejected (lease lost: a newer epoch holds the job)",
        Err(_) => "failed",
    }
}

async fn kill(child: &mut Child) -> std::io::Result<()> {
    child.start_kill()?;
    child.wait().await.map(drop)
}

async fn done(admin: &Client) -> Result<i64, pg_lease_client::Error> {
    let stats = admin.queue_stats().await?;
    Ok(stats
        .iter()
        .find(|s| s.queue == QUEUE)
        .map_or(0, |s| s.done))
}

async fn reaper_preloaded(conn: &str) -> Result<bool, BoxError> {
    let pg = raw(conn).await?;
    let row = pg
        .query_one(
            "SELECT current_setting('shared_preload_libraries') LIKE '%pg_lease%'",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// A plain tokio-postgres connection for the read-only report queries.
async fn raw(conn: &str) -> Result<tokio_postgres::Client, BoxError> {
    let (pg, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(pg)
}

async fn report(conn: &str, zombie: &pg_lease_client::Lease) -> Result<(), BoxError> {
    let pg = raw(conn).await?;
    for row in pg
        .query(
            "SELECT payload->>'done_by', count(*), count(*) FILTER (WHERE attempt > 1)
               FROM lease.job WHERE queue = $1 AND state = 'done' GROUP BY 1 ORDER BY 1",
            &[&QUEUE],
        )
        .await?
    {
        let (who, jobs, retried): (Option<String>, i64, i64) = (row.get(0), row.get(1), row.get(2));
        say(
            who.as_deref().unwrap_or("?"),
            format!(
                "{jobs} jobs done ({retried} of them recovered from a dead replica or the zombie)"
            ),
        );
    }
    let row = pg
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE payload->>'done_by' = 'zombie'),
                    (SELECT recovered_total FROM lease.queue_stats WHERE queue = $1)
               FROM lease.job WHERE queue = $1",
            &[&QUEUE],
        )
        .await?;
    let (jobs_done, by_zombie, recovered): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    let zrow = pg
        .query_one(
            "SELECT payload->>'done_by', epoch FROM lease.job WHERE id = $1",
            &[&zombie.id()],
        )
        .await?;
    let (zdone_by, zepoch): (Option<String>, i64) = (zrow.get(0), zrow.get(1));
    println!(
        "\n  {jobs_done} of {JOBS} jobs done, each exactly once; {recovered} expired leases recovered;"
    );
    println!(
        "  the zombie's job #{} was finished by {} at epoch {zepoch} (the zombie held epoch {}); zombie writes that landed: {by_zombie}.",
        zombie.id(),
        zdone_by.as_deref().unwrap_or("?"),
        zombie.epoch()
    );
    Ok(())
}
