//! `fault_client_worker`: the fault suite's workload (`pg_tests/tests/faults.rs`) run by
//! `pg_lease_client::Worker` instead of hand-written SQL. Test-only.
//!
//! The Worker claims, heartbeats and records outcomes; the handler does
//! what an application would: each step of an item is a fenced write
//! through [`Job::transaction`], and the completion (event, domain write
//! and `lease.release`) is one fenced transaction, so the handler answers
//! [`Outcome::Released`]. Everything the checker judges (events, stale
//! operations, notes) is written in the same transactions as the fault
//! suite's own worker writes them, with `at` = the transaction's start
//! (`now()`, taken before the fence).
//!
//! Item kinds on their first attempt: `hang` (the handler waits for its
//! token, bounded by 4 × ttl since a Worker renews a running handler for
//! as long as it runs), `stall` (the handler blocks the process's only
//! runtime thread for 3 × ttl, as a long GC pause or a blocking call on
//! an async runtime would: the heartbeat stops with it; then it tries a
//! fenced write, `fenced_update`, `renew` and `release` as the stale owner
//! it now is), `commitloss` (runs as `normal`: the Worker's connections
//! are not the handler's to drop; connections lost at COMMIT come from the
//! suite's faults).
//!
//! Arguments: `conn=<libpq string>` `worker=<n>` `slots=<n>` `ttl_ms=<n>`
//! `max_secs=<n>`, and `bind=1` for leases bound to the Worker's session
//! (`WorkerConfig::bind_session`). Its owner and every connection's `application_name` is
//! `w<worker>-t0`, which the suite's fault injection and sampler match.
//! The process exits when its stdin closes or after `max_secs`.

use std::sync::Arc;
use std::time::Duration;

use pg_lease_client::{
    CancelReason, CancellationToken, Client, Error, HandlerResult, Job, Outcome, Worker,
    WorkerConfig,
};
use pg_tests::child::{key_values, number};
use tokio::time::{sleep, timeout, Instant};
use tokio_postgres::NoTls;

/// Settings from the command line.
#[derive(Debug)]
struct Config {
    conn: String,
    owner: String,
    slots: usize,
    ttl: Duration,
    max_secs: u64,
    bind: bool,
}

impl Config {
    fn from_args() -> Result<Config, String> {
        let (mut conn, mut worker, mut slots, mut ttl_ms, mut max_secs, mut bind) =
            (String::new(), 0, 3, 400, 600, 0);
        for (key, value) in key_values()? {
            let num = || number(&key, &value);
            match key.as_str() {
                "conn" => conn = value,
                "worker" => worker = num()?,
                "slots" => slots = num()?,
                "ttl_ms" => ttl_ms = num()?,
                "max_secs" => max_secs = num()?,
                "bind" => bind = num()?,
                _ => return Err(format!("unknown argument {key}")),
            }
        }
        if conn.is_empty() {
            return Err("conn=<connection string> is required".into());
        }
        let owner = format!("w{worker}-t0");
        Ok(Config {
            conn: format!("{conn} application_name={owner}"),
            owner,
            slots: usize::try_from(slots).map_err(|e| e.to_string())?,
            ttl: Duration::from_millis(ttl_ms),
            max_secs,
            bind: bind != 0,
        })
    }
}

/// One item's instructions, from its payload.
struct Item {
    kind: String,
    steps: i64,
    work: Duration,
}

impl Item {
    fn of(job: &Job) -> Item {
        let p = job.payload();
        Item {
            kind: p["kind"].as_str().unwrap_or("normal").to_owned(),
            steps: p["steps"].as_i64().unwrap_or(1).max(1),
            work: Duration::from_millis(p["work_ms"].as_u64().unwrap_or(50).max(1)),
        }
    }
}

/// The handler: the item's steps, each a fenced write, then the fenced
/// completion.
async fn handle(cfg: Arc<Config>, job: Job) -> HandlerResult {
    let item = Item::of(&job);
    let first = job.lease().attempt() == 1;
    for step in 1..=item.steps {
        let work = if first && item.kind == "hang" {
            cfg.ttl * 4
        } else {
            item.work
        };
        tokio::select! {
            () = job.cancelled() => return Ok(on_cancel(&cfg, &job).await),
            () = sleep(work) => {}
        }
        if first && item.kind == "hang" {
            note(&cfg, "gave_up_hang", &job).await;
            return Ok(Outcome::retry("hung handler given up"));
        }
        if first && item.kind == "stall" && step == 2 {
            // Blocks the runtime's only thread: heartbeats stop too, and so
            // does a transaction another slot has open (the note excuses it).
            note(&cfg, "stalling", &job).await;
            std::thread::sleep(cfg.ttl * 3);
            stale_ops(&cfg, &job).await;
            return Ok(Outcome::retry("stalled"));
        }
        match write(&job, "step", "").await {
            Ok(()) => {}
            Err(Fail::Lost) => {
                note(&cfg, "write_rejected", &job).await;
                return Ok(Outcome::retry("step write refused"));
            }
            Err(Fail::Other(e)) => return Err(e.into()),
        }
    }
    complete(&cfg, &job).await
}

/// The token fired: acknowledge a cancel with a fenced abandon (which
/// ends the row cancelled), give back the row at shutdown, and otherwise
/// (lease lost or unconfirmed) answer retry, which a lost lease refuses.
async fn on_cancel(cfg: &Config, job: &Job) -> Outcome {
    match job.cancel_reason() {
        Some(CancelReason::CancelRequested) => {
            let release = release_sql(cfg, job, "abandon");
            match write(job, "cancel_ack", &release).await {
                Ok(()) => Outcome::Released,
                Err(_) => Outcome::retry("cancel acknowledgement refused"),
            }
        }
        Some(CancelReason::Shutdown) => Outcome::Abandon,
        _ => Outcome::retry("lease not confirmed"),
    }
}

fn release_sql(cfg: &Config, job: &Job, outcome: &str) -> String {
    let l = job.lease();
    format!(
        "SELECT fault.must(lease.release({}, '{}', {}, '{outcome}'));",
        l.id(),
        cfg.owner,
        l.epoch()
    )
}

/// Why a fenced write did not commit.
#[derive(Debug)]
enum Fail {
    /// The fence refused: the lease is no longer this job's.
    Lost,
    /// Anything else; after a COMMIT was sent, its outcome is unknown.
    Other(String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        if e.is_lease_lost() {
            Fail::Lost
        } else {
            Fail::Other(e.to_string())
        }
    }
}

/// One fenced transaction: the event, the domain write, and `finish`.
async fn write(job: &Job, op: &str, finish: &str) -> Result<(), Fail> {
    let l = job.lease();
    let counter = if op == "complete" {
        "completions"
    } else {
        "steps_done"
    };
    let sql = format!(
        "INSERT INTO fault.events (item, epoch, owner, op, at) VALUES ({id}, {epoch}, '{owner}', '{op}', now());
         UPDATE fault.items SET {counter} = {counter} + 1, last_epoch = {epoch} WHERE item = {id};
         {finish}",
        id = l.id(),
        epoch = l.epoch(),
        owner = l.owner(),
    );
    let tx = job.transaction().await?;
    tx.batch_execute(&sql)
        .await
        .map_err(|e| Fail::Other(e.to_string()))?;
    Ok(tx.commit().await?)
}

/// The completion; when its COMMIT's outcome is unknown (connection lost),
/// try again: the fence then refuses if that COMMIT went through (or the
/// lease was lost meanwhile), and the history says which.
async fn complete(cfg: &Config, job: &Job) -> HandlerResult {
    let release = release_sql(cfg, job, "done");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut unknown = false;
    loop {
        match write(job, "complete", &release).await {
            Ok(()) => {
                if unknown {
                    note(cfg, "unknown_commit_retried", job).await;
                }
                return Ok(Outcome::Released);
            }
            Err(Fail::Lost) if !unknown => {
                note(cfg, "complete_rejected", job).await;
                return Ok(Outcome::retry("completion refused"));
            }
            Err(Fail::Lost) => {
                let l = job.lease();
                let sql = format!(
                    "SELECT count(*) FROM fault.events WHERE item = {} AND epoch = {} AND op = 'complete'",
                    l.id(),
                    l.epoch()
                );
                return Ok(match raw_count(cfg, &sql).await {
                    Some(0) => {
                        note(cfg, "unknown_commit_retry_refused", job).await;
                        Outcome::retry("completion refused")
                    }
                    _ => {
                        note(cfg, "unknown_commit_was_committed", job).await;
                        Outcome::Released
                    }
                });
            }
            Err(Fail::Other(e)) if Instant::now() >= deadline => return Err(e.into()),
            Err(Fail::Other(_)) => {
                unknown = true;
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// As the stale owner after a stall: a fenced write, `fenced_update`,
/// `renew` and `release`, each recorded with its transaction id.
async fn stale_ops(cfg: &Config, job: &Job) {
    let (id, epoch, owner) = (job.lease().id(), job.lease().epoch(), &cfg.owner);
    match write(job, "step", "").await {
        Ok(()) => record_stale(cfg, job, "write", true, "NULL").await,
        Err(Fail::Lost) => record_stale(cfg, job, "write", false, "NULL").await,
        Err(Fail::Other(_)) => {}
    }
    let ttl_ms = cfg.ttl.as_millis();
    for (op, sql) in [
        ("fenced_update", format!("SELECT lease.fenced_update({id}, {epoch}, '{{\"stale\": true}}'), txid_current()")),
        ("renew", format!("SELECT held, txid_current() FROM lease.renew({id}, '{owner}', {epoch}, interval '{ttl_ms} milliseconds')")),
        ("release", format!("SELECT lease.release({id}, '{owner}', {epoch}, 'done'), txid_current()")),
    ] {
        let Some(pg) = raw(cfg).await else { continue };
        if let Ok(Ok(row)) = timeout(Duration::from_secs(5), pg.query_one(&sql, &[])).await {
            let (accepted, xid): (bool, i64) = (row.get(0), row.get(1));
            record_stale(cfg, job, op, accepted, &xid.to_string()).await;
        }
    }
}

async fn record_stale(cfg: &Config, job: &Job, op: &str, accepted: bool, xid: &str) {
    let l = job.lease();
    let sql = format!(
        "INSERT INTO fault.stale (item, epoch, owner, op, accepted, xid) VALUES ({}, {}, '{}', '{op}', {accepted}, {xid})",
        l.id(), l.epoch(), cfg.owner
    );
    raw_exec(cfg, &sql).await;
}

/// Records something the checker counts; best effort.
async fn note(cfg: &Config, kind: &str, job: &Job) {
    let l = job.lease();
    let sql = format!(
        "INSERT INTO fault.notes (owner, kind, item, epoch) VALUES ('{}', '{kind}', {}, {})",
        cfg.owner,
        l.id(),
        l.epoch()
    );
    raw_exec(cfg, &sql).await;
}

/// A connection of its own for the rare bookkeeping above (a new one each
/// time: these writes are few, and must not wait behind the Worker's).
async fn raw(cfg: &Config) -> Option<tokio_postgres::Client> {
    let (pg, connection) = timeout(
        Duration::from_secs(3),
        tokio_postgres::connect(&cfg.conn, NoTls),
    )
    .await
    .ok()?
    .ok()?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Some(pg)
}

async fn raw_exec(cfg: &Config, sql: &str) {
    if let Some(pg) = raw(cfg).await {
        let _ = timeout(Duration::from_secs(5), pg.batch_execute(sql)).await;
    }
}

async fn raw_count(cfg: &Config, sql: &str) -> Option<i64> {
    let pg = raw(cfg).await?;
    let row = timeout(Duration::from_secs(5), pg.query_one(sql, &[]))
        .await
        .ok()?
        .ok()?;
    Some(row.get(0))
}

fn main() {
    let cfg = match Config::from_args() {
        Ok(cfg) => Arc::new(cfg),
        Err(err) => {
            eprintln!("fault_client_worker: {err}");
            std::process::exit(2);
        }
    };
    pg_tests::child::exit_when_stdin_closes_or_after(Duration::from_secs(cfg.max_secs));
    // One thread, so that a stalled handler stalls the whole process.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("fault_client_worker: no tokio runtime: {err}");
            std::process::exit(2);
        }
    };
    let result = runtime.block_on(async move {
        let client = Client::connect(&cfg.conn).await?;
        let mut config = WorkerConfig::new("q").with_ttl(cfg.ttl);
        config.owner = cfg.owner.clone();
        config.concurrency = cfg.slots;
        config.poll_interval = Duration::from_millis(50);
        config.bind_session = cfg.bind;
        let handler_cfg = Arc::clone(&cfg);
        let worker = Worker::new(client, config, move |job| {
            handle(Arc::clone(&handler_cfg), job)
        });
        worker.run(CancellationToken::new()).await.map(drop)
    });
    if let Err(err) = result {
        eprintln!("fault_client_worker: {err}");
        std::process::exit(1);
    }
}
