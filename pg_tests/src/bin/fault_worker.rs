//! `fault_worker`: one worker OS process of the fault-injection suite
//! (`pg_tests/tests/faults.rs`). Test-only; not part of any product.
//!
//! It runs `tasks` independent tasks against queue `q`, each with its own
//! connection (`application_name` = its owner name `w<worker>-t<task>`):
//! claim a few rows, run a "handler" per row (a sleep, heartbeating every
//! ttl/3 with `renew_batch` while it runs), fence-write one event per step,
//! and complete with an event and `release` in one transaction. Every
//! accepted write appends to `fault.events` in the same transaction as the
//! write, so the test's checker can judge the history in SQL.
//!
//! The payload's `kind` picks a misbehaviour on the row's first attempt:
//! `hang` (the handler never returns; the task gives up after a budget and
//! lets the lease expire), `stall` (the task pauses 3 × ttl without
//! heartbeats, then tries a fenced write, `fenced_update`, `renew` and
//! `release` as the stale owner it now is, recording each result in
//! `fault.stale`), `commitloss` (the connection is dropped right after
//! COMMIT is sent: unknown outcome, resolved by re-reading the history).
//!
//! Arguments are `key=value` pairs: `conn=<libpq string>` `worker=<n>`
//! `tasks=<n>` `seed=<n>` `ttl_ms=<n>` `max_secs=<n>`, and the test-only
//! switches `mode=unfenced` (writes without `lease.fence`, completion and
//! cancel by a plain `UPDATE` by id: the hand-written code pg_lease
//! replaces, for the checker's control run) and `handler_in_txn=1` (keeps a
//! transaction open while the handler runs: a deliberate break).
//!
//! The process exits when its stdin closes (the test went away) or after
//! `max_secs`, so it never outlives a test run.

use std::sync::Arc;
use std::time::Duration;

use pg_tests::child::{key_values, number};
use pg_tests::Rng;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_postgres::{Client, NoTls, Row};

/// Longest any single request may take before the connection is treated
/// as dead; well above a partition's length, so delayed requests (the
/// interesting zombies) still arrive.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings from the command line.
#[derive(Debug)]
struct Config {
    conn: String,
    worker: u32,
    tasks: u32,
    seed: u64,
    ttl: Duration,
    max_secs: u64,
    fenced: bool,
    handler_in_txn: bool,
}

impl Config {
    fn from_args() -> Result<Config, String> {
        let mut cfg = Config {
            conn: String::new(),
            worker: 0,
            tasks: 3,
            seed: 1,
            ttl: Duration::from_millis(400),
            max_secs: 600,
            fenced: true,
            handler_in_txn: false,
        };
        for (key, value) in key_values()? {
            let num = || number(&key, &value);
            match key.as_str() {
                "conn" => cfg.conn = value,
                "worker" => cfg.worker = num()? as u32,
                "tasks" => cfg.tasks = num()? as u32,
                "seed" => cfg.seed = num()?,
                "ttl_ms" => cfg.ttl = Duration::from_millis(num()?),
                "max_secs" => cfg.max_secs = num()?,
                "mode" => cfg.fenced = value != "unfenced",
                "handler_in_txn" => cfg.handler_in_txn = value == "1",
                _ => return Err(format!("unknown argument {key}")),
            }
        }
        if cfg.conn.is_empty() {
            return Err("conn=<connection string> is required".into());
        }
        Ok(cfg)
    }

    /// How long a handler that never returns is given before the task
    /// stops renewing its lease and moves on.
    fn hang_budget(&self) -> Duration {
        self.ttl * 4
    }
}

/// Why an operation did not go through.
#[derive(Debug)]
enum Fail {
    /// The lease is gone (`LE001` from `fence`, `FT001` from a release that
    /// returned false, or held = false): stop working on the row.
    Lost,
    /// The connection failed or timed out; the outcome of the last request
    /// is unknown. The connection has been dropped.
    Conn,
}

/// A connection and its driver task; dropping it closes the socket at once.
struct Conn {
    client: Client,
    driver: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A row this task has claimed.
#[derive(Clone, Debug)]
struct Held {
    id: i64,
    epoch: i64,
    attempt: i32,
    kind: String,
    steps: i32,
    work_ms: u64,
    /// The lease is known lost or finished: no more renewals.
    gone: bool,
    cancel_requested: bool,
}

/// One task: its owner name, connection, and the leases it holds.
struct Task {
    cfg: Arc<Config>,
    owner: String,
    rng: Rng,
    conn: Option<Conn>,
    held: Vec<Held>,
    next_heartbeat: Instant,
}

const CLAIM: &str = "\
WITH c AS (
    SELECT * FROM lease.claim_pending($1::int, $2::bigint * interval '1 millisecond', $3::text, 'q')
), log AS (
    INSERT INTO fault.claims (owner, lim, got)
    SELECT $3::text, $1::int, count(*) FROM c HAVING count(*) > 0
)
SELECT id, epoch, attempt,
       coalesce(payload->>'kind', 'normal'),
       coalesce((payload->>'steps')::int, 1),
       coalesce((payload->>'work_ms')::bigint, 50)
  FROM c";

impl Task {
    fn new(cfg: Arc<Config>, t: u32) -> Task {
        let seed = cfg.seed ^ (u64::from(cfg.worker) << 32) ^ u64::from(t);
        Task {
            owner: format!("w{}-t{t}", cfg.worker),
            rng: Rng::new(seed),
            cfg,
            conn: None,
            held: Vec::new(),
            next_heartbeat: Instant::now(),
        }
    }

    fn heartbeat_every(&self) -> Duration {
        self.cfg.ttl / 3
    }

    fn ttl_ms(&self) -> i64 {
        self.cfg.ttl.as_millis() as i64
    }

    /// The task's connection, (re)connecting if needed.
    async fn client(&mut self) -> Result<&Client, Fail> {
        if self.conn.is_none() {
            let conn_str = format!(
                "{} application_name={} connect_timeout=3",
                self.cfg.conn, self.owner
            );
            let (client, connection) =
                timeout(REQUEST_TIMEOUT, tokio_postgres::connect(&conn_str, NoTls))
                    .await
                    .map_err(|_| Fail::Conn)?
                    .map_err(|_| Fail::Conn)?;
            let driver = tokio::spawn(async move {
                let _ = connection.await;
            });
            self.conn = Some(Conn { client, driver });
        }
        match &self.conn {
            Some(conn) => Ok(&conn.client),
            None => Err(Fail::Conn),
        }
    }

    /// Classifies a failed request; anything but a lost lease drops the
    /// connection, since its state (open transaction or not) is unknown.
    fn failed(&mut self, err: Option<tokio_postgres::Error>) -> Fail {
        if let Some(err) = &err {
            if let Some(db) = err.as_db_error() {
                match db.code().code() {
                    "LE001" | "FT001" => return Fail::Lost,
                    // Terminated backend, shutdown, recovery: expected here.
                    code if code.starts_with("57") || code.starts_with("08") => {}
                    _ => eprintln!("fault_worker {}: unexpected error: {db}", self.owner),
                }
            }
        }
        self.conn = None;
        Fail::Conn
    }

    /// Runs `sql` (one or more statements) with the simple protocol. Without
    /// an explicit BEGIN, several statements form one implicit transaction.
    async fn batch(&mut self, sql: &str) -> Result<(), Fail> {
        let client = self.client().await?;
        match timeout(REQUEST_TIMEOUT, client.batch_execute(sql)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(self.failed(Some(err))),
            Err(_) => Err(self.failed(None)),
        }
    }

    async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, Fail> {
        let client = self.client().await?;
        match timeout(REQUEST_TIMEOUT, client.query(sql, params)).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(err)) => Err(self.failed(Some(err))),
            Err(_) => Err(self.failed(None)),
        }
    }

    /// Records something the checker counts; best effort.
    async fn note(&mut self, kind: &str, h: &Held) {
        let sql = format!(
            "INSERT INTO fault.notes (owner, kind, item, epoch) VALUES ('{}', '{kind}', {}, {})",
            self.owner, h.id, h.epoch
        );
        let _ = self.batch(&sql).await;
    }

    /// Claims, processes and finishes one batch of rows.
    async fn cycle(&mut self) -> Result<(), Fail> {
        let limit = 1 + self.rng.below(3) as i32;
        let ttl_ms = self.ttl_ms();
        let owner = self.owner.clone();
        let rows = self.query(CLAIM, &[&limit, &ttl_ms, &owner]).await?;
        if rows.is_empty() {
            let pause = 20 + self.rng.below(40);
            sleep(Duration::from_millis(pause)).await;
            return Ok(());
        }
        self.held = rows
            .iter()
            .map(|r| Held {
                id: r.get(0),
                epoch: r.get(1),
                attempt: r.get(2),
                kind: r.get(3),
                steps: r.get::<_, i32>(4).max(1),
                work_ms: r.get::<_, i64>(5).max(1) as u64,
                gone: false,
                cancel_requested: false,
            })
            .collect();
        self.next_heartbeat = Instant::now() + self.heartbeat_every();
        for i in 0..self.held.len() {
            if !self.held[i].gone {
                // Lost or unreachable: the lease expires and the reaper
                // hands the row to someone else. Nothing more to do here.
                let _ = self.process(i).await;
            }
            self.held[i].gone = true;
        }
        self.held.clear();
        Ok(())
    }

    /// One renew_batch for every lease still held; marks lost ones.
    async fn heartbeat(&mut self) -> Result<(), Fail> {
        self.next_heartbeat = Instant::now() + self.heartbeat_every();
        let live: Vec<usize> = (0..self.held.len())
            .filter(|&i| !self.held[i].gone)
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = live.iter().map(|&i| self.held[i].id).collect();
        let epochs: Vec<i64> = live.iter().map(|&i| self.held[i].epoch).collect();
        let ttl_ms = self.ttl_ms();
        let owner = self.owner.clone();
        let rows = self
            .query(
                "SELECT held, coalesce(cancel_requested, false) FROM lease.renew_batch($1, $2, $3, $4::bigint * interval '1 millisecond')",
                &[&ids, &owner, &epochs, &ttl_ms],
            )
            .await?;
        for (k, row) in rows.iter().enumerate() {
            let Some(&i) = live.get(k) else { break };
            // NULL: busy (locked by another transaction), held but not
            // extended; the next heartbeat tries again.
            if row.get::<_, Option<bool>>(0) == Some(false) {
                self.held[i].gone = true;
                let h = self.held[i].clone();
                self.note("renew_lost", &h).await;
            } else if row.get::<_, bool>(1) {
                self.held[i].cancel_requested = true;
            }
        }
        Ok(())
    }

    /// Runs the handler of every step of row `i`, fence-writing each step,
    /// then completes the row.
    async fn process(&mut self, i: usize) -> Result<(), Fail> {
        let h = self.held[i].clone();
        let first = h.attempt == 1;
        for step in 1..=h.steps {
            if self.cfg.handler_in_txn {
                // Deliberate break: the fence's transaction spans the handler.
                let begin = format!(
                    "BEGIN; SELECT set_config('fault.at', clock_timestamp()::text, true); {}",
                    self.fence_sql(&h)
                );
                if let Err(fail) = self.batch(&begin).await {
                    let _ = self.batch("ROLLBACK").await;
                    return Err(fail);
                }
            }
            // The handler: a sleep, or forever for a hanging one.
            let started = Instant::now();
            let work = Duration::from_millis(h.work_ms);
            let end = (!(first && h.kind == "hang")).then_some(started + work);
            loop {
                let now = Instant::now();
                if end.is_some_and(|end| now >= end) {
                    break;
                }
                if now >= self.next_heartbeat {
                    self.heartbeat().await?;
                    if self.held[i].gone {
                        return Err(Fail::Lost);
                    }
                    if self.held[i].cancel_requested {
                        if self.cfg.handler_in_txn {
                            self.batch("ROLLBACK").await?;
                        }
                        return self.ack_cancel(&h).await;
                    }
                    if end.is_none() && started.elapsed() > self.cfg.hang_budget() {
                        // Give up on a handler that never returns: stop
                        // renewing; the lease expires and is recovered.
                        if self.cfg.handler_in_txn {
                            self.batch("ROLLBACK").await?;
                        }
                        self.held[i].gone = true;
                        self.note("gave_up_hang", &h).await;
                        return Err(Fail::Lost);
                    }
                    continue;
                }
                let wake = end.map_or(self.next_heartbeat, |end| end.min(self.next_heartbeat));
                sleep_until(wake).await;
            }
            if first && h.kind == "stall" && step == 2 {
                // A pause with no heartbeat (GC, swap, a blocked thread):
                // the lease expires, and this task comes back as a zombie.
                sleep(self.cfg.ttl * 3).await;
                self.held[i].gone = true;
                self.stale_ops(&h).await;
                return Err(Fail::Lost);
            }
            self.write(&h, "step").await?;
        }
        self.complete(&h).await
    }

    fn fence_sql(&self, h: &Held) -> String {
        if self.cfg.fenced {
            format!("SELECT lease.fence({}, {});", h.id, h.epoch)
        } else {
            String::new()
        }
    }

    /// Statements of a write: the event (timestamped before the fence
    /// check) and the domain update. Without BEGIN, one implicit transaction.
    fn write_sql(&self, h: &Held, op: &str) -> String {
        let event = format!(
            "INSERT INTO fault.events (item, epoch, owner, op, at) \
             VALUES ({}, {}, '{}', '{op}', current_setting('fault.at')::timestamptz);",
            h.id, h.epoch, self.owner
        );
        let domain = match op {
            "complete" => format!(
                "UPDATE fault.items SET completions = completions + 1, last_epoch = {} WHERE item = {};",
                h.epoch, h.id
            ),
            _ => format!(
                "UPDATE fault.items SET steps_done = steps_done + 1, last_epoch = {} WHERE item = {};",
                h.epoch, h.id
            ),
        };
        if self.cfg.handler_in_txn && op == "step" {
            // BEGIN, the timestamp and the fence went out before the handler.
            return format!("{event} {domain} COMMIT;");
        }
        format!(
            "SELECT set_config('fault.at', clock_timestamp()::text, true); {} {event} {domain}",
            self.fence_sql(h)
        )
    }

    /// A fenced step write.
    async fn write(&mut self, h: &Held, op: &str) -> Result<(), Fail> {
        let sql = self.write_sql(h, op);
        let result = self.batch(&sql).await;
        if matches!(result, Err(Fail::Lost)) {
            if self.cfg.handler_in_txn {
                let _ = self.batch("ROLLBACK").await;
            }
            self.note("write_rejected", h).await;
        }
        result
    }

    /// The transaction that completes row `h`: event, domain write and
    /// release together, or nothing.
    fn complete_sql(&self, h: &Held) -> String {
        let finish = if self.cfg.fenced {
            format!(
                "SELECT fault.must(lease.release({}, '{}', {}, 'done'));",
                h.id, self.owner, h.epoch
            )
        } else {
            format!(
                "UPDATE lease.job SET state = 'done', lease_until = NULL, finished_at = clock_timestamp() WHERE id = {};",
                h.id
            )
        };
        let write = self.write_sql(h, "complete");
        format!("{write} {finish}")
    }

    async fn complete(&mut self, h: &Held) -> Result<(), Fail> {
        let sql = self.complete_sql(h);
        if h.attempt == 1 && h.kind == "commitloss" {
            // fault.slow_commit makes this transaction's COMMIT take 200 ms
            // (a deferred trigger), so the connection can be lost with the
            // COMMIT in flight.
            match self
                .batch(&format!("BEGIN; SET LOCAL fault.slow_commit = 'on'; {sql}"))
                .await
            {
                Ok(()) => {}
                Err(Fail::Lost) => {
                    let _ = self.batch("ROLLBACK").await;
                    return Err(Fail::Lost);
                }
                Err(Fail::Conn) => return self.resolve_completion(h).await,
            }
            if let Some(conn) = self.conn.take() {
                if self.rng.below(2) == 0 {
                    // Lost before COMMIT went out: the server rolls back.
                    self.note("commit_lost_before_sending", h).await;
                } else {
                    // Lost while COMMIT runs: the server commits, unseen.
                    let commit = conn.client.batch_execute("COMMIT");
                    let _ = timeout(Duration::from_millis(50), commit).await;
                    self.note("commit_lost_in_flight", h).await;
                }
                drop(conn);
            }
            if self.rng.below(2) == 0 {
                // Sometimes look only after the slow COMMIT is over, so
                // both ways of resolving the outcome are exercised.
                sleep(Duration::from_millis(300)).await;
            }
            return self.resolve_completion(h).await;
        }
        match self.batch(&sql).await {
            Ok(()) => Ok(()),
            Err(Fail::Lost) => {
                self.note("complete_rejected", h).await;
                Err(Fail::Lost)
            }
            Err(Fail::Conn) => self.resolve_completion(h).await,
        }
    }

    /// After a completion whose outcome is unknown: reconnect, look for its
    /// event (written in the same transaction as the release), and retry
    /// the whole transaction if it is not there. The retry is fenced, so it
    /// fails if the lease was lost meanwhile.
    async fn resolve_completion(&mut self, h: &Held) -> Result<(), Fail> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let found = self
                .query(
                    "SELECT count(*) FROM fault.events WHERE item = $1 AND epoch = $2 AND op = 'complete'",
                    &[&h.id, &h.epoch],
                )
                .await;
            match found {
                Ok(rows) if rows.first().is_some_and(|r| r.get::<_, i64>(0) > 0) => {
                    self.note("unknown_commit_was_committed", h).await;
                    return Ok(());
                }
                Ok(_) => {
                    // Not there (yet: the lost COMMIT may still be running;
                    // then the retry's fence waits for it and is refused).
                    let sql = self.complete_sql(h);
                    match self.batch(&sql).await {
                        Ok(()) => {
                            self.note("unknown_commit_retried", h).await;
                            return Ok(());
                        }
                        Err(Fail::Lost) => {
                            self.note("unknown_commit_retry_refused", h).await;
                            return Err(Fail::Lost);
                        }
                        Err(Fail::Conn) => {}
                    }
                }
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
        Err(Fail::Conn)
    }

    /// Cancel requested: record it and give the row back; a cancel-requested
    /// row given back ends `cancelled`.
    async fn ack_cancel(&mut self, h: &Held) -> Result<(), Fail> {
        let finish = if self.cfg.fenced {
            format!(
                "SELECT fault.must(lease.release({}, '{}', {}, 'abandon'));",
                h.id, self.owner, h.epoch
            )
        } else {
            format!(
                "UPDATE lease.job SET state = 'cancelled', lease_until = NULL, finished_at = clock_timestamp() WHERE id = {};",
                h.id
            )
        };
        let event = format!(
            "SELECT set_config('fault.at', clock_timestamp()::text, true); {} \
             INSERT INTO fault.events (item, epoch, owner, op, at) \
             VALUES ({}, {}, '{}', 'cancel_ack', current_setting('fault.at')::timestamptz);",
            self.fence_sql(h),
            h.id,
            h.epoch,
            self.owner
        );
        self.batch(&format!("{event} {finish}")).await
    }

    /// As a stale owner: try a write, fenced_update, renew and release, and
    /// record what each did, with its transaction id, for the checker.
    async fn stale_ops(&mut self, h: &Held) {
        let write = self.write(h, "step").await;
        if !matches!(write, Err(Fail::Conn)) {
            self.record_stale(h, "write", write.is_ok(), None).await;
        }
        let (id, epoch, owner, ttl_ms) = (h.id, h.epoch, self.owner.clone(), self.ttl_ms());
        let renew = format!(
            "SELECT held, txid_current() FROM lease.renew({id}, '{owner}', {epoch}, interval '{ttl_ms} milliseconds')"
        );
        let ops: [(&str, String); 3] = if self.cfg.fenced {
            [
                (
                    "fenced_update",
                    format!("SELECT lease.fenced_update({id}, {epoch}, '{{\"stale\": true}}'), txid_current()"),
                ),
                ("renew", renew),
                (
                    "release",
                    format!("SELECT lease.release({id}, '{owner}', {epoch}, 'done'), txid_current()"),
                ),
            ]
        } else {
            [
                (
                    "fenced_update",
                    format!("WITH u AS (UPDATE lease.job SET payload = payload || '{{\"stale\": true}}' WHERE id = {id} RETURNING 1) SELECT count(*) > 0, txid_current() FROM u"),
                ),
                ("renew", renew),
                (
                    "release",
                    format!("WITH u AS (UPDATE lease.job SET state = 'done', lease_until = NULL, finished_at = clock_timestamp() WHERE id = {id} RETURNING 1) SELECT count(*) > 0, txid_current() FROM u"),
                ),
            ]
        };
        for (op, sql) in ops {
            if let Ok(rows) = self.query(&sql, &[]).await {
                if let Some(row) = rows.first() {
                    let accepted: bool = row.get(0);
                    let xid: i64 = row.get(1);
                    self.record_stale(h, op, accepted, Some(xid)).await;
                }
            }
        }
    }

    async fn record_stale(&mut self, h: &Held, op: &str, accepted: bool, xid: Option<i64>) {
        let xid = xid.map_or("NULL".to_owned(), |x| x.to_string());
        let sql = format!(
            "INSERT INTO fault.stale (item, epoch, owner, op, accepted, xid) VALUES ({}, {}, '{}', '{op}', {accepted}, {xid})",
            h.id, h.epoch, self.owner
        );
        let _ = self.batch(&sql).await;
    }
}

async fn run_task(cfg: Arc<Config>, t: u32) {
    let mut task = Task::new(cfg, t);
    loop {
        if task.cycle().await.is_err() {
            // Connection gone (terminated, partitioned, server restarting):
            // back off a little and reconnect on the next request.
            let pause = 50 + task.rng.below(100);
            sleep(Duration::from_millis(pause)).await;
        }
    }
}

fn main() {
    let cfg = match Config::from_args() {
        Ok(cfg) => Arc::new(cfg),
        Err(err) => {
            eprintln!("fault_worker: {err}");
            std::process::exit(2);
        }
    };
    pg_tests::child::exit_when_stdin_closes_or_after(Duration::from_secs(cfg.max_secs));
    let runtime = pg_tests::child::runtime("fault_worker");
    runtime.block_on(async move {
        let tasks: Vec<_> = (0..cfg.tasks)
            .map(|t| tokio::spawn(run_task(Arc::clone(&cfg), t)))
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    });
}
