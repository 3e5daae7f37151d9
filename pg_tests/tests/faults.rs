//! Correctness under faults: a history-checked fault-injection suite.
//!
//! Worker OS processes (`src/bin/fault_worker.rs`, several tasks each)
//! claim, renew, fence-write and release rows of queue `q` on a preloaded
//! cluster (reaper sweeping every 100 ms, ttl 400 ms) while this test
//! injects faults: SIGSTOP/SIGCONT of a worker beyond its ttl, kill -9 of a
//! worker holding leases, `pg_terminate_backend` of worker connections and
//! of the reaper, delays, partitions and cuts of one worker's connections
//! through a TCP proxy, `pg_ctl restart -m immediate`; items make their
//! handler hang forever, stall past the ttl (then act as the stale owner),
//! or lose the connection while COMMIT is in flight (unknown outcome,
//! retried). A trigger records every change of `lease.job` in
//! `fault.history`, and each accepted write appends to `fault.events` in
//! its own transaction, so every invariant is a SQL query over the history
//! (`CHECKS` below); the sampler of `pg_stat_activity` adds the last one.
//! `worker_survives_faults` runs the same workload through the client's
//! `Worker` (`src/bin/fault_client_worker.rs`) and holds it to the same
//! checks; `bound_worker_survives_faults` does too with the Worker's leases
//! bound to its session (`WorkerConfig::bind_session`), so that every kill,
//! terminated session, cut and restart also ends leases early.
//!
//! * `one_valid_owner` — at most one valid owner per item at any database
//!   time: accepted writes never go back to an older epoch, and no lease is
//!   taken over (new epoch or owner) before it expired.
//! * `epochs_increase` — each claim's epoch exceeds every earlier epoch of
//!   the row, across server restarts, and no change is missing in between.
//! * `writes_carry_current_epoch` — at each accepted write, the row was
//!   leased at that epoch to that owner and not expired.
//! * `stale_ops_change_nothing` — after a stall, the stale owner's fenced
//!   write, `fenced_update`, `renew` and `release` are refused and change
//!   no row; no lease is renewed after it expired.
//! * `exactly_one_completion` — a done item has exactly one accepted
//!   completion (and the domain counter agrees); other items have none.
//! * `no_lost_work` — after the faults stop, every item is final within
//!   hang budget + ttl + sweep interval + backoff + work time + slack.
//! * `claim_limit` — no claim leased more rows than its limit.
//! * `rate_limit` — no 250 ms hold more claimed rows than the queue's rate
//!   limit, 3 (12 a second: the items come at about 7 a second, retries
//!   and the backlogs of restarts in bursts).
//! * `attempts_once_per_claim` — a claim spends one attempt, an expiry none
//!   (so each expiry costs exactly one attempt), an abandon gives one back:
//!   the owner's release (same epoch) acknowledging a cancel, or of a row
//!   its handler never wrote at (a `Worker` gives back rows that waited
//!   too long for a slot, as after a stall or a slow claim).
//! * `cancel_never_lost` — a cancelled item ends cancelled (or done, if its
//!   owner finished it); a cancel-requested row never goes back to pending.
//! * `no_txn_during_handler` — no worker session sits idle in transaction
//!   for more than 300 ms (handlers run outside transactions), except a
//!   worker the test itself stopped or partitioned, or a `Worker` process
//!   that a `stall` item froze (its only thread blocked, a transaction of
//!   another slot waits with it: seen once in CI, 17 samples
//!   of one w3-t0 session after `lease.fence`).
//!
//! The control (`control_without_fencing_finds_violations`) runs the same
//! workload with the worker's test-only switch `mode=unfenced` (writes
//! without `lease.fence`, completion by a plain UPDATE by id): the checker
//! must report violations, or the harness is broken.
//!
//! Broken on purpose (`PG_LEASE_FAULTS_BREAK=<name>` replaces one function
//! in the throwaway cluster only, then runs the CI workload); each run
//! failed, with the checks named (violations found, seed 42):
//! * `fence_ignores_epoch` → writes_carry_current_epoch 1, one_valid_owner
//!   1, stale_ops_change_nothing 1 (a stalled owner's write went through);
//! * `reap_early` (reaps leases 300 ms before they expire) →
//!   one_valid_owner 74;
//! * `claim_keeps_epoch` → epochs_increase 212;
//! * `claim_over_limit` (`LIMIT n + 1`) → claim_limit 1;
//! * `rate_ignores_limit` (a claim takes every row it asks for, whatever
//!   the rate limit) → rate_limit 4–6;
//! * `reap_spends_attempt` → attempts_once_per_claim 28;
//! * `reap_forgets_cancel` → cancel_never_lost 4;
//! * `fenced_update_ignores_epoch` → stale_ops_change_nothing 2;
//! * `no_reaper` (`lease.reaper_enabled = off`) → no_lost_work 24,
//!   cancel_never_lost 29;
//! * `handler_in_txn` (the worker keeps the fence's transaction open
//!   across the handler) → no_txn_during_handler 208, and
//!   stale_ops_change_nothing 12 (a fence taken before a stall does not
//!   protect the writes after it).
//!
//! With the `Worker` driver (`worker_survives_faults`, seed 42):
//! * `fence_ignores_epoch` → one_valid_owner 2, stale_ops_change_nothing 1,
//!   writes_carry_current_epoch 2;
//! * `reap_spends_attempt` → attempts_once_per_claim 20;
//! * `Job::transaction` without its `lease.fence` (client/src/transaction.rs
//!   edited by hand) → one_valid_owner 6, stale_ops_change_nothing 6,
//!   writes_carry_current_epoch 8: a handler stalled past its ttl wrote as
//!   the stale owner.
//!
//! The unfenced control trips writes_carry_current_epoch, one_valid_owner,
//! stale_ops_change_nothing and attempts_once_per_claim in every run so
//! far, and, depending on timing, exactly_one_completion (a lost COMMIT
//! retried without a fence completes twice).
//!
//! Runs: CI runs the seeded short suite (`cargo test -p pg_tests --test
//! faults`, under a minute); the soak is
//! `PG_LEASE_SOAK_SECS=600 cargo test -p pg_tests --test faults -- --ignored soak --nocapture`.
//! `PG_LEASE_FAULTS_SEED` changes the seed. A seed fixes the fault schedule
//! and the items; timing still varies from run to run.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_tests::proxy::Proxy;
use pg_tests::{Cluster, ClusterConfig, Rng, TEST_DB};
use tokio::time::{sleep, timeout};
use tokio_postgres::{Client, NoTls, Row};

/// Lease ttl of every claim and renewal.
const TTL_MS: u64 = 400;
/// `lease.sweep_interval` of the cluster.
const SWEEP_MS: u64 = 100;
/// The queue's `backoff_max`.
const BACKOFF_MAX_MS: u64 = 200;
/// Longest handler: 3 steps of at most 120 ms.
const MAX_WORK_MS: u64 = 360;
/// The worker's budget for a handler that never returns (4 × ttl).
const HANG_BUDGET_MS: u64 = 4 * TTL_MS;
/// Slack for a loaded 2-core machine and reconnecting after a restart.
const SLACK_MS: u64 = 3000;
/// A worker session idle in transaction longer than this is a violation.
const IDLE_IN_TXN_MS: u64 = 300;
/// How long a `stall` item freezes its process (3 × ttl), with slack.
const STALL_MS: u64 = 3 * TTL_MS + 300;

/// The tests share the machine's two cores: one run at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What runs the workload in each worker process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Driver {
    /// `src/bin/fault_worker.rs`: `tasks` loops of hand-written SQL.
    Sql,
    /// `src/bin/fault_client_worker.rs`: `pg_lease_client::Worker` with
    /// `tasks` slots and fenced transactions from `Job::transaction`.
    Worker,
    /// The same with `bind=1`: the Worker's leases bound to its listening
    /// session, which the faults' kills, terminations, cuts and restarts end.
    BoundWorker,
}

/// What one run does.
#[derive(Clone, Debug)]
struct Params {
    label: &'static str,
    seed: u64,
    fault_secs: u64,
    workers: usize,
    tasks: u32,
    driver: Driver,
    fenced: bool,
    break_name: Option<String>,
}

impl Params {
    /// Sessions of worker `id` are named `w<id>-t<k>` for `k` below this.
    fn session_names(&self) -> u32 {
        match self.driver {
            Driver::Sql => self.tasks,
            Driver::Worker | Driver::BoundWorker => 1,
        }
    }
}

/// A connection that reconnects after the server restarts or kills it.
struct Db {
    conn: String,
    client: Option<Client>,
}

impl Db {
    fn new(conn: String) -> Db {
        Db { conn, client: None }
    }

    async fn query(&mut self, sql: &str) -> Result<Vec<Row>, String> {
        if self.client.is_none() {
            let (client, connection) = match timeout(
                Duration::from_secs(5),
                tokio_postgres::connect(&self.conn, NoTls),
            )
            .await
            {
                Ok(Ok(pair)) => pair,
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("connect timed out".into()),
            };
            tokio::spawn(async move {
                let _ = connection.await;
            });
            self.client = Some(client);
        }
        let client = self.client.as_ref().expect("connected above");
        match timeout(Duration::from_secs(30), client.query(sql, &[])).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => {
                if e.as_db_error().is_none() {
                    self.client = None;
                }
                Err(format!("{sql}: {e:?}"))
            }
            Err(_) => {
                self.client = None;
                Err(format!("{sql}: timed out"))
            }
        }
    }

    /// Retries `sql` until it succeeds (the server may be restarting).
    async fn must(&mut self, sql: &str) -> Vec<Row> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.query(sql).await {
                Ok(rows) => return rows,
                Err(e) if Instant::now() > deadline => panic!("{e}"),
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn count(&mut self, sql: &str) -> i64 {
        self.must(sql).await[0].get(0)
    }
}

/// One worker process; SIGCONT'd and killed on drop.
struct Worker {
    id: u32,
    child: Child,
}

impl Worker {
    fn spawn(id: u32, conn: &str, p: &Params) -> Worker {
        let mut cmd = match p.driver {
            Driver::Sql => {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_fault_worker"));
                cmd.arg(format!("tasks={}", p.tasks))
                    .arg(format!("seed={}", p.seed))
                    .arg(format!(
                        "mode={}",
                        if p.fenced { "fenced" } else { "unfenced" }
                    ))
                    .arg(format!(
                        "handler_in_txn={}",
                        u8::from(p.break_name.as_deref() == Some("handler_in_txn"))
                    ));
                cmd
            }
            Driver::Worker | Driver::BoundWorker => {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_fault_client_worker"));
                cmd.arg(format!("slots={}", p.tasks)).arg(format!(
                    "bind={}",
                    u8::from(p.driver == Driver::BoundWorker)
                ));
                cmd
            }
        };
        cmd.arg(format!("conn={conn}"))
            .arg(format!("worker={id}"))
            .arg(format!("ttl_ms={TTL_MS}"))
            .arg(format!("max_secs={}", p.fault_secs + 180))
            // The worker exits when this pipe closes, i.e. when we go away.
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd.spawn().expect("spawn fault_worker");
        Worker { id, child }
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {}", self.child.id());
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Worker sessions the sampler must not judge: ones the test stopped or
/// partitioned (their open transactions are the fault, not the worker's).
#[derive(Default)]
struct Excused {
    until: HashMap<u32, Instant>,
    all_until: Option<Instant>,
}

impl Excused {
    fn excuse(&mut self, id: u32) {
        self.until
            .insert(id, Instant::now() + Duration::from_secs(3600));
    }

    fn release(&mut self, id: u32) {
        self.until
            .insert(id, Instant::now() + Duration::from_millis(500));
    }

    fn is_excused(&self, id: u32) -> bool {
        let now = Instant::now();
        self.all_until.is_some_and(|t| t > now) || self.until.get(&id).is_some_and(|&t| t > now)
    }
}

const SETUP: &str = r#"
SELECT lease.create_queue('q', max_attempts => 1000, backoff_base => '10 milliseconds',
                          backoff_max => '200 milliseconds', retention => '1 hour',
                          rate_limit => 3, rate_period => '250 milliseconds');
CREATE SCHEMA fault;
-- The domain table: one row per item, written by fenced writes.
CREATE TABLE fault.items (
    item bigint PRIMARY KEY, kind text NOT NULL,
    steps_done int NOT NULL DEFAULT 0, completions int NOT NULL DEFAULT 0, last_epoch bigint);
-- Accepted writes, appended in the writing transaction; "at" is taken just
-- before the fence, xid identifies the transaction.
CREATE TABLE fault.events (
    seq bigserial PRIMARY KEY, item bigint NOT NULL, epoch bigint NOT NULL, owner text NOT NULL,
    op text NOT NULL, at timestamptz NOT NULL, xid bigint NOT NULL DEFAULT txid_current());
CREATE INDEX ON fault.events (item, at);
CREATE INDEX ON fault.events (xid);
-- Every change of lease.job, written by a trigger in the changing transaction.
CREATE TABLE fault.history (
    seq bigserial PRIMARY KEY, item bigint NOT NULL, tg_op text NOT NULL,
    old_state text, new_state text, old_epoch bigint, new_epoch bigint,
    old_owner text, new_owner text, old_attempt int, new_attempt int,
    old_until timestamptz, new_until timestamptz, old_cancel boolean, new_cancel boolean,
    old_next_at timestamptz, new_next_at timestamptz,
    at timestamptz NOT NULL DEFAULT clock_timestamp(), xid bigint NOT NULL DEFAULT txid_current());
CREATE INDEX ON fault.history (item, at);
CREATE INDEX ON fault.history (xid);
CREATE TABLE fault.claims (
    seq bigserial PRIMARY KEY, owner text NOT NULL, lim int NOT NULL, got bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(), xid bigint NOT NULL DEFAULT txid_current());
CREATE TABLE fault.stale (
    seq bigserial PRIMARY KEY, item bigint NOT NULL, epoch bigint NOT NULL, owner text NOT NULL,
    op text NOT NULL, accepted boolean NOT NULL, xid bigint,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE fault.cancels (
    seq bigserial PRIMARY KEY, item bigint NOT NULL, result text,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE fault.notes (
    seq bigserial PRIMARY KEY, owner text, kind text NOT NULL, item bigint, epoch bigint,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE fault.restarts (at timestamptz NOT NULL);
-- Aborts the worker's completion transaction when release says the lease is lost.
CREATE FUNCTION fault.must(ok boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION 'lease lost at release' USING ERRCODE = 'FT001';
    END IF;
END $$;
-- Makes a COMMIT slow when the worker asks (SET LOCAL fault.slow_commit),
-- so that it can lose its connection while the COMMIT runs.
CREATE FUNCTION fault.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('fault.slow_commit', true) = 'on' THEN
        PERFORM pg_sleep(0.2);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER fault_slow_commit AFTER INSERT ON fault.events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fault.slow_commit();
CREATE FUNCTION fault.record() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO fault.history (item, tg_op, new_state, new_epoch, new_owner, new_attempt, new_until, new_cancel)
        VALUES (NEW.id, TG_OP, NEW.state, NEW.epoch, NEW.owner, NEW.attempt, NEW.lease_until, NEW.cancel_requested);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO fault.history (item, tg_op, old_state, new_state, old_epoch, new_epoch, old_owner, new_owner,
                                   old_attempt, new_attempt, old_until, new_until, old_cancel, new_cancel,
                                   old_next_at, new_next_at)
        VALUES (NEW.id, TG_OP, OLD.state, NEW.state, OLD.epoch, NEW.epoch, OLD.owner, NEW.owner,
                OLD.attempt, NEW.attempt, OLD.lease_until, NEW.lease_until, OLD.cancel_requested, NEW.cancel_requested,
                OLD.next_at, NEW.next_at);
    ELSE
        INSERT INTO fault.history (item, tg_op, old_state, old_epoch, old_owner, old_attempt, old_until, old_cancel)
        VALUES (OLD.id, TG_OP, OLD.state, OLD.epoch, OLD.owner, OLD.attempt, OLD.lease_until, OLD.cancel_requested);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER fault_history AFTER INSERT OR UPDATE OR DELETE ON lease.job
    FOR EACH ROW EXECUTE FUNCTION fault.record();
"#;

/// The invariants: each query returns one row (item, detail) per violation.
const CHECKS: &[(&str, &str)] = &[
    (
        "one_valid_owner",
        r#"
SELECT item, format('item %s: %s by %s at epoch %s at %s, after a write at epoch %s',
                    item, op, owner, epoch, at, prev)
  FROM (SELECT e.*, max(epoch) OVER (PARTITION BY item ORDER BY at, seq
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
          FROM fault.events e) x
 WHERE prev > epoch
UNION ALL
SELECT item, format('item %s: lease of %s at epoch %s, valid until %s, taken at %s (now %s, %s, epoch %s)',
                    item, old_owner, old_epoch, old_until, at, new_state, new_owner, new_epoch)
  FROM fault.history
 WHERE tg_op = 'UPDATE' AND old_state = 'leased' AND old_until > at
   AND (new_epoch <> old_epoch OR new_owner IS DISTINCT FROM old_owner)"#,
    ),
    (
        "epochs_increase",
        r#"
SELECT item, format('item %s at %s: %s -> %s, epoch %s -> %s; the row had epoch %s before, highest %s',
                    item, at, old_state, new_state, old_epoch, new_epoch, prev_epoch, max_before)
  FROM (SELECT h.*, lag(new_epoch) OVER w AS prev_epoch,
               max(greatest(old_epoch, new_epoch)) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS max_before
          FROM fault.history h WINDOW w AS (PARTITION BY item ORDER BY seq)) x
 WHERE tg_op = 'UPDATE'
   AND (new_epoch < old_epoch
        OR old_epoch IS DISTINCT FROM prev_epoch
        OR (old_state <> 'leased' AND new_state = 'leased' AND new_epoch <= coalesce(max_before, -1)))"#,
    ),
    (
        "writes_carry_current_epoch",
        r#"
SELECT e.item, format('item %s: %s by %s at epoch %s at %s, but the row was %s at epoch %s (owner %s, until %s)',
                      e.item, e.op, e.owner, e.epoch, e.at, h.new_state, h.new_epoch, h.new_owner, h.new_until)
  FROM fault.events e
  LEFT JOIN LATERAL (SELECT * FROM fault.history h
                      WHERE h.item = e.item AND h.at <= e.at
                      ORDER BY h.at DESC, h.seq DESC LIMIT 1) h ON true
 WHERE h.seq IS NULL OR h.new_state IS DISTINCT FROM 'leased' OR h.new_epoch <> e.epoch
    OR h.new_owner IS DISTINCT FROM e.owner OR h.new_until <= e.at"#,
    ),
    (
        "stale_ops_change_nothing",
        r#"
SELECT item, format('item %s: stale %s by %s at epoch %s was accepted', item, op, owner, epoch)
  FROM fault.stale WHERE accepted
UNION ALL
SELECT s.item, format('item %s: stale %s by %s at epoch %s changed the row: %s -> %s, epoch %s -> %s',
                      s.item, s.op, s.owner, s.epoch, h.old_state, h.new_state, h.old_epoch, h.new_epoch)
  FROM fault.stale s JOIN fault.history h ON h.xid = s.xid
UNION ALL
-- 100 ms tolerance: the trigger's clock runs a little after the renewal's check.
SELECT item, format('item %s: lease of %s at epoch %s renewed at %s, after it expired at %s',
                    item, old_owner, old_epoch, at, old_until)
  FROM fault.history
 WHERE tg_op = 'UPDATE' AND old_state = 'leased' AND new_state = 'leased' AND new_epoch = old_epoch
   AND new_until > old_until AND old_until < at - interval '100 milliseconds'"#,
    ),
    (
        "exactly_one_completion",
        r#"
SELECT j.id, format('item %s: %s with %s accepted completions (domain counter %s)',
                    j.id, j.state, coalesce(c.n, 0), i.completions)
  FROM lease.job j
  LEFT JOIN fault.items i ON i.item = j.id
  LEFT JOIN (SELECT item, count(*) AS n FROM fault.events WHERE op = 'complete' GROUP BY item) c ON c.item = j.id
 WHERE j.queue = 'q'
   AND (coalesce(c.n, 0) <> CASE WHEN j.state = 'done' THEN 1 ELSE 0 END
        OR i.completions IS DISTINCT FROM coalesce(c.n, 0)::int)"#,
    ),
    (
        "no_lost_work",
        r#"
SELECT id, format('item %s still %s after the faults stopped (attempt %s, epoch %s, owner %s)',
                  id, state, attempt, epoch, owner)
  FROM lease.job WHERE queue = 'q' AND state IN ('pending', 'leased')"#,
    ),
    (
        "claim_limit",
        r#"
SELECT NULL::bigint, format('claim by %s at %s asked for %s rows, returned %s, leased %s',
                            c.owner, c.at, c.lim, c.got, coalesce(h.n, 0))
  FROM fault.claims c
  LEFT JOIN (SELECT xid, count(*) AS n FROM fault.history
              WHERE tg_op = 'UPDATE' AND old_state = 'pending' AND new_state = 'leased'
              GROUP BY xid) h ON h.xid = c.xid
 WHERE c.got > c.lim OR coalesce(h.n, 0) > c.lim"#,
    ),
    (
        "rate_limit",
        // Each claim leased its rows until its time plus the ttl.
        r#"
SELECT NULL::bigint, format('%s rows claimed in the 250 ms from %s (the queue allows 3)', n, s)
  FROM (SELECT new_until - interval '400 milliseconds' AS s,
               count(*) OVER (ORDER BY new_until
                              RANGE BETWEEN CURRENT ROW AND interval '249999 microseconds' FOLLOWING) AS n
          FROM fault.history
         WHERE tg_op = 'UPDATE' AND old_state = 'pending' AND new_state = 'leased') x
 WHERE n > 3"#,
    ),
    (
        "attempts_once_per_claim",
        r#"
SELECT item, format('item %s at %s: %s -> %s, epoch %s -> %s, attempt %s -> %s (row had attempt %s)',
                    item, at, old_state, new_state, old_epoch, new_epoch, old_attempt, new_attempt, prev_attempt)
  FROM (SELECT h.*, lag(new_attempt) OVER (PARTITION BY item ORDER BY seq) AS prev_attempt,
               -- An abandon is the owner's release (the epoch stays; a reap
               -- moves it on) that keeps the row's place (a retry moves
               -- next_at), legitimate when it acknowledges a cancel or gives
               -- back a row its handler never wrote at (the Worker's rows
               -- that waited too long for a slot).
               old_state = 'leased' AND new_state IN ('pending', 'cancelled') AND new_epoch = old_epoch
               AND new_next_at = old_next_at
               AND (EXISTS (SELECT 1 FROM fault.events e
                             WHERE e.xid = h.xid AND e.item = h.item AND e.op = 'cancel_ack')
                    OR NOT EXISTS (SELECT 1 FROM fault.events e
                                    WHERE e.item = h.item AND e.epoch = h.old_epoch)) AS abandon
          FROM fault.history h) x
 WHERE tg_op = 'UPDATE'
   AND (old_attempt IS DISTINCT FROM prev_attempt
        OR new_attempt - old_attempt <> CASE
               WHEN old_state <> 'leased' AND new_state = 'leased' THEN 1   -- a claim spends one
               WHEN abandon AND old_state = 'leased' THEN -1                -- an abandon gives it back
               ELSE 0 END)                                                   -- expiry, renewal, release, cancel"#,
    ),
    (
        "cancel_never_lost",
        r#"
SELECT c.item, format('item %s: cancel said %s at %s, yet the item ended %s', c.item, c.result, c.at, j.state)
  FROM fault.cancels c JOIN lease.job j ON j.id = c.item
 WHERE (c.result = 'cancelled' AND j.state <> 'cancelled')
    OR (c.result = 'cancel_requested' AND j.state NOT IN ('cancelled', 'done'))
UNION ALL
SELECT item, format('item %s at %s: cancel requested, yet %s -> %s (epoch %s -> %s)',
                    item, at, old_state, new_state, old_epoch, new_epoch)
  FROM fault.history
 WHERE tg_op = 'UPDATE' AND old_cancel
   AND (new_state = 'pending' OR (old_state <> 'leased' AND new_state = 'leased') OR NOT new_cancel)"#,
    ),
];

/// What a run found.
struct Outcome {
    summary: String,
    violations: BTreeMap<String, Vec<String>>,
}

impl Outcome {
    fn total(&self) -> usize {
        self.violations.values().map(Vec::len).sum()
    }
}

/// Replaces one extension function in this throwaway cluster with a broken
/// copy (see the module docs); panics if the function no longer contains
/// the text the break expects.
async fn apply_break(db: &mut Db, name: &str) {
    if name == "handler_in_txn" {
        return; // a worker-side break, passed on the worker's command line
    }
    if name == "no_reaper" {
        db.must("ALTER SYSTEM SET lease.reaper_enabled = off").await;
        db.must("SELECT pg_reload_conf()").await;
        return;
    }
    let (function, from, to) = match name {
        "fence_ignores_epoch" => (
            "lease.fence(bigint,bigint)",
            "j.epoch = fence.epoch",
            "true",
        ),
        "reap_early" => (
            "lease._reap(integer,text)",
            "j.lease_until <= t",
            "j.lease_until <= t + interval '300 milliseconds'",
        ),
        "claim_keeps_epoch" => (
            "lease.claim_pending(integer,interval,text,text)",
            "epoch       = greatest(j.epoch + 1, f)",
            "epoch       = j.epoch",
        ),
        "claim_over_limit" => (
            "lease.claim_pending(integer,interval,text,text)",
            "LIMIT n",
            "LIMIT n + 1",
        ),
        "reap_spends_attempt" => (
            "lease._reap(integer,text)",
            "epoch       = greatest(j.epoch + 1, f),",
            "epoch       = greatest(j.epoch + 1, f), attempt = j.attempt + 1,",
        ),
        "reap_forgets_cancel" => (
            "lease._reap(integer,text)",
            "lease._next_state('retry', j.cancel_requested,",
            "lease._next_state('retry', false,",
        ),
        "rate_ignores_limit" => (
            "lease._rate_take(text,interval,integer)",
            "greatest(share_permits - lease._rate_used(kept_starts, kept_counts, clock_timestamp() - period), 0)",
            "wanted",
        ),
        "fenced_update_ignores_epoch" => (
            "lease.fenced_update(bigint,bigint,jsonb)",
            "j.epoch = fenced_update.epoch",
            "true",
        ),
        other => panic!("unknown PG_LEASE_FAULTS_BREAK {other:?}"),
    };
    let rows = db
        .must(&format!(
            "SELECT pg_get_functiondef('{function}'::regprocedure)"
        ))
        .await;
    let def: String = rows[0].get(0);
    assert!(
        def.contains(from),
        "break {name}: {function} no longer contains {from:?}"
    );
    db.must(&def.replace(from, to)).await;
    eprintln!("faults: BROKEN ON PURPOSE: {name}");
}

/// Enqueues an item every 150 ms until `stop`: every 20th hangs, stalls or
/// loses its COMMIT on the first attempt.
async fn enqueue_loop(conn: String, seed: u64, stop: Arc<AtomicBool>) {
    let mut db = Db::new(conn);
    let mut rng = Rng::new(seed ^ 0xE0);
    let mut n: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        let kind = match n % 20 {
            0 => "hang",
            1 => "stall",
            2 => "commitloss",
            _ => "normal",
        };
        let steps = if kind == "stall" {
            2 + rng.below(2)
        } else {
            1 + rng.below(3)
        };
        let work_ms = 20 + rng.below(100);
        let sql = format!(
            "WITH e AS (SELECT lease.enqueue('q', jsonb_build_object('kind', '{kind}', 'steps', {steps}, 'work_ms', {work_ms})) AS id)
             INSERT INTO fault.items (item, kind) SELECT id, '{kind}' FROM e"
        );
        if db.query(&sql).await.is_ok() {
            n += 1;
        }
        sleep(Duration::from_millis(150)).await;
    }
}

/// Cancels a recent unfinished item every 700 ms until `stop`.
async fn cancel_loop(conn: String, seed: u64, stop: Arc<AtomicBool>) {
    let mut db = Db::new(conn);
    let mut rng = Rng::new(seed ^ 0xCA);
    while !stop.load(Ordering::SeqCst) {
        sleep(Duration::from_millis(700)).await;
        let offset = rng.below(5);
        let _ = db
            .query(&format!(
                "INSERT INTO fault.cancels (item, result)
                 SELECT id, lease.cancel(id) FROM (
                     SELECT id FROM lease.job WHERE queue = 'q' AND state IN ('pending', 'leased')
                      ORDER BY id DESC OFFSET {offset} LIMIT 1) x"
            ))
            .await;
    }
}

/// Samples `pg_stat_activity` every 50 ms for worker sessions idle in
/// transaction for longer than [`IDLE_IN_TXN_MS`].
async fn sample_loop(
    conn: String,
    excused: Arc<Mutex<Excused>>,
    stop: Arc<AtomicBool>,
    found: Arc<Mutex<Vec<String>>>,
) {
    let mut db = Db::new(conn);
    let sql = format!(
        "SELECT application_name, state, (extract(epoch FROM clock_timestamp() - state_change) * 1000)::bigint,
                left(query, 120)
           FROM pg_stat_activity
          WHERE application_name ~ '^w[0-9]+-t[0-9]+$'
            AND state LIKE 'idle in transaction%'
            AND clock_timestamp() - state_change > interval '{IDLE_IN_TXN_MS} milliseconds'
            -- The process froze itself meanwhile (fault_client_worker's stall).
            AND NOT EXISTS (SELECT FROM fault.notes n
                             WHERE n.kind = 'stalling' AND n.owner = application_name
                               AND n.at > state_change - interval '{STALL_MS} milliseconds')"
    );
    while !stop.load(Ordering::SeqCst) {
        if let Ok(rows) = db.query(&sql).await {
            for row in rows {
                let app: String = row.get(0);
                let id: u32 = app[1..app.find('-').unwrap_or(1)]
                    .parse()
                    .unwrap_or(u32::MAX);
                if excused.lock().expect("excused").is_excused(id) {
                    continue;
                }
                let ms: i64 = row.get(2);
                let query: String = row.get(3);
                found.lock().expect("found").push(format!(
                    "{app} {} for {ms} ms (last statement: {query})",
                    row.get::<_, String>(1)
                ));
            }
        }
        sleep(Duration::from_millis(50)).await;
    }
}

/// The faults, one of each first (in a seeded order), then at random.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Sigstop,
    Kill9,
    TerminateWorker,
    TerminateReaper,
    ProxyDelay,
    ProxyPartition,
    ProxyCut,
    Restart,
}

const ALL_FAULTS: [Fault; 8] = [
    Fault::Sigstop,
    Fault::Kill9,
    Fault::TerminateWorker,
    Fault::TerminateReaper,
    Fault::ProxyDelay,
    Fault::ProxyPartition,
    Fault::ProxyCut,
    Fault::Restart,
];

/// Runs the workload with faults for `p.fault_secs`, waits for it to
/// settle, stops everything and runs the checker.
async fn run(p: Params) -> Outcome {
    let _serial = SERIAL.lock().await;
    let cluster = Arc::new(Cluster::start_with(ClusterConfig::with_reaper(
        Duration::from_millis(SWEEP_MS),
    )));
    let conn = cluster.conn_string(TEST_DB);
    let mut db = Db::new(conn.clone());
    // As the test role: with the install without the library that is the
    // database's owner, who owns lease.job too (the history trigger).
    cluster
        .connect()
        .await
        .batch_execute(SETUP)
        .await
        .expect("fault schema");
    if let Some(name) = &p.break_name {
        apply_break(&mut db, name).await;
    }

    // Worker slot 0 talks through the proxy; the others directly.
    let proxy = Proxy::start(cluster.port()).await;
    let slot_conn = |slot: usize| {
        if slot == 0 {
            proxy.conn_string(TEST_DB)
        } else {
            conn.clone()
        }
    };
    let mut next_id = 0u32;
    let mut workers: Vec<Worker> = (0..p.workers)
        .map(|slot| {
            next_id += 1;
            Worker::spawn(next_id - 1, &slot_conn(slot), &p)
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let stop_sampler = Arc::new(AtomicBool::new(false));
    let excused = Arc::new(Mutex::new(Excused::default()));
    let idle_in_txn = Arc::new(Mutex::new(Vec::new()));
    let background = vec![
        tokio::spawn(enqueue_loop(conn.clone(), p.seed, Arc::clone(&stop))),
        tokio::spawn(cancel_loop(conn.clone(), p.seed, Arc::clone(&stop))),
        tokio::spawn(sample_loop(
            conn.clone(),
            Arc::clone(&excused),
            Arc::clone(&stop_sampler),
            Arc::clone(&idle_in_txn),
        )),
    ];

    // The fault schedule.
    let mut rng = Rng::new(p.seed);
    let mut schedule = ALL_FAULTS.to_vec();
    for i in (1..schedule.len()).rev() {
        schedule.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut injected: BTreeMap<Fault, u32> = BTreeMap::new();
    let mut last_restart: Option<Instant> = None;
    let started = Instant::now();
    let ttl = Duration::from_millis(TTL_MS);
    while started.elapsed() < Duration::from_secs(p.fault_secs) {
        sleep(Duration::from_millis(400 + rng.below(800))).await;
        let mut fault = if schedule.is_empty() {
            ALL_FAULTS[rng.below(ALL_FAULTS.len() as u64) as usize]
        } else {
            schedule.remove(0)
        };
        // Restarts cost seconds; at most one per 10 s.
        if fault == Fault::Restart && last_restart.is_some_and(|t| t.elapsed().as_secs() < 10) {
            fault = Fault::TerminateWorker;
        }
        let slot = rng.below(workers.len() as u64) as usize;
        let id = workers[slot].id;
        match fault {
            Fault::Sigstop => {
                excused.lock().expect("excused").excuse(id);
                workers[slot].signal("-STOP");
                // Cancel one of its rows: the cancel must survive the expiry.
                let _ = db
                    .query(&format!(
                        "INSERT INTO fault.cancels (item, result)
                         SELECT id, lease.cancel(id) FROM (
                             SELECT id FROM lease.job
                              WHERE owner LIKE 'w{id}-%' AND state = 'leased' ORDER BY id LIMIT 1) x"
                    ))
                    .await;
                sleep(ttl * 3 + Duration::from_millis(rng.below(TTL_MS))).await;
                workers[slot].signal("-CONT");
                excused.lock().expect("excused").release(id);
            }
            Fault::Kill9 => {
                let conn = slot_conn(slot);
                let old = std::mem::replace(&mut workers[slot], Worker::spawn(next_id, &conn, &p));
                next_id += 1;
                drop(old); // SIGKILL, whatever it holds
            }
            Fault::TerminateWorker => {
                let pattern = if rng.below(2) == 0 {
                    format!("w{id}-%")
                } else {
                    format!("w{id}-t{}", rng.below(u64::from(p.session_names())))
                };
                let _ = db
                    .query(&format!(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                          WHERE application_name LIKE '{pattern}'"
                    ))
                    .await;
            }
            Fault::TerminateReaper => {
                let _ = db
                    .query(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                          WHERE backend_type IN ('pg_lease launcher', 'pg_lease sweeper', 'pg_lease reserve')",
                    )
                    .await;
            }
            Fault::ProxyDelay | Fault::ProxyPartition => {
                let proxied = workers[0].id;
                let length = if fault == Fault::ProxyDelay {
                    Duration::from_millis(50 + rng.below(100))
                } else {
                    ttl * 3
                };
                excused.lock().expect("excused").excuse(proxied);
                proxy.pause();
                sleep(length).await;
                proxy.resume();
                excused.lock().expect("excused").release(proxied);
            }
            Fault::ProxyCut => proxy.cut(),
            Fault::Restart => {
                excused.lock().expect("excused").all_until =
                    Some(Instant::now() + Duration::from_secs(3600));
                let before: String = db.must("SELECT clock_timestamp()::text").await[0].get(0);
                let c = Arc::clone(&cluster);
                tokio::task::spawn_blocking(move || c.restart_immediate())
                    .await
                    .expect("restart");
                db.must(&format!("INSERT INTO fault.restarts VALUES ('{before}')"))
                    .await;
                excused.lock().expect("excused").all_until =
                    Some(Instant::now() + Duration::from_millis(500));
                last_restart = Some(Instant::now());
            }
        }
        *injected.entry(fault).or_default() += 1;
    }

    // Faults stop: no more items, then every item must become final.
    stop.store(true, Ordering::SeqCst);
    let faults_stopped = Instant::now();
    let bound = Duration::from_millis(
        HANG_BUDGET_MS + TTL_MS + SWEEP_MS + BACKOFF_MAX_MS + MAX_WORK_MS + SLACK_MS,
    );
    let mut settled = None;
    while faults_stopped.elapsed() < bound + Duration::from_secs(20) {
        let open = db
            .count("SELECT count(*) FROM lease.job WHERE queue = 'q' AND state IN ('pending', 'leased')")
            .await;
        if open == 0 {
            settled = Some(faults_stopped.elapsed());
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    stop_sampler.store(true, Ordering::SeqCst);
    for task in background {
        let _ = task.await;
    }
    drop(workers);
    drop(proxy);

    // The checker.
    let mut violations: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, sql) in CHECKS {
        let rows = db.must(sql).await;
        violations.insert(
            (*name).to_owned(),
            rows.iter().map(|r| r.get::<_, String>(1)).collect(),
        );
    }
    match settled {
        Some(took) if took <= bound => {}
        Some(took) => violations
            .entry("no_lost_work".into())
            .or_default()
            .push(format!("settled after {took:?}, bound {bound:?}")),
        None => {} // the query above lists the unfinished items
    }
    violations.insert(
        "no_txn_during_handler".into(),
        idle_in_txn.lock().expect("found").clone(),
    );
    let summary = summarize(&mut db, &p, &injected, settled, bound, &violations).await;
    Outcome {
        summary,
        violations,
    }
}

async fn summarize(
    db: &mut Db,
    p: &Params,
    injected: &BTreeMap<Fault, u32>,
    settled: Option<Duration>,
    bound: Duration,
    violations: &BTreeMap<String, Vec<String>>,
) -> String {
    let stats = db
        .must(
            "SELECT (SELECT count(*) FROM fault.items),
                    (SELECT count(*) FILTER (WHERE state = 'done') FROM lease.job WHERE queue = 'q'),
                    (SELECT count(*) FILTER (WHERE state = 'cancelled') FROM lease.job WHERE queue = 'q'),
                    (SELECT count(*) FILTER (WHERE state = 'dead') FROM lease.job WHERE queue = 'q'),
                    (SELECT count(*) FROM fault.claims),
                    (SELECT coalesce(sum(got), 0)::bigint FROM fault.claims),
                    (SELECT count(*) FROM fault.history WHERE tg_op = 'UPDATE' AND old_state = 'leased'
                        AND new_state = 'leased' AND new_until > old_until),
                    (SELECT count(*) FROM fault.events),
                    (SELECT count(*) FROM fault.events WHERE op = 'complete'),
                    (SELECT count(*) FROM fault.history WHERE tg_op = 'UPDATE' AND old_state = 'leased'
                        AND new_epoch > old_epoch),
                    (SELECT count(*) FROM fault.stale),
                    (SELECT count(*) FROM fault.stale WHERE NOT accepted),
                    (SELECT count(*) FROM fault.cancels WHERE result IN ('cancelled', 'cancel_requested')),
                    (SELECT count(DISTINCT h.item) FROM fault.history h JOIN fault.restarts r ON h.at > r.at
                      WHERE h.old_state = 'pending' AND h.new_state = 'leased'
                        AND EXISTS (SELECT 1 FROM fault.history b WHERE b.item = h.item AND b.at < r.at
                                       AND b.old_state = 'pending' AND b.new_state = 'leased'))",
        )
        .await;
    let s = &stats[0];
    let n = |i: usize| s.get::<_, i64>(i);
    let notes: Vec<String> = db
        .must("SELECT kind, count(*) FROM fault.notes GROUP BY kind ORDER BY kind")
        .await
        .iter()
        .map(|r| format!("{} {}", r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect();
    let faults: Vec<String> = injected.iter().map(|(f, n)| format!("{f:?} {n}")).collect();
    let total: usize = violations.values().map(Vec::len).sum();
    let mut out = format!(
        "faults summary [{} run, seed {}, {} s of faults, {} workers x {} tasks ({:?}), ttl {TTL_MS} ms{}]\n\
         items: {} (done {}, cancelled {}, dead {})\n\
         operations: {} claims ({} leases), {} renewals, {} accepted writes ({} completions), \
         {} expiries recovered, {} stale-owner ops ({} refused), {} cancels\n\
         worker notes: {}\n\
         faults injected: {} (plus hung handlers, stalls and lost COMMITs from the items)\n\
         items claimed again after a server restart: {}\n\
         settled: {} (bound {bound:?})\n\
         violations: {total}\n",
        p.label,
        p.seed,
        p.fault_secs,
        p.workers,
        p.tasks,
        p.driver,
        p.break_name
            .as_deref()
            .map(|b| format!(", BROKEN: {b}"))
            .unwrap_or_default(),
        n(0),
        n(1),
        n(2),
        n(3),
        n(4),
        n(5),
        n(6),
        n(7),
        n(8),
        n(9),
        n(10),
        n(11),
        n(12),
        notes.join(", "),
        faults.join(", "),
        n(13),
        settled.map_or("never".to_owned(), |d| format!("{d:.1?}")),
    );
    for (name, found) in violations {
        out.push_str(&format!("  {name}: {}\n", found.len()));
        for example in found.iter().take(3) {
            out.push_str(&format!("      e.g. {example}\n"));
        }
    }
    out
}

fn seed() -> u64 {
    std::env::var("PG_LEASE_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(42)
}

fn break_name() -> Option<String> {
    std::env::var("PG_LEASE_FAULTS_BREAK")
        .ok()
        .filter(|s| !s.is_empty())
}

/// Asserts that a fenced run found nothing and exercised what it claims to.
fn assert_clean(outcome: &Outcome) {
    println!("{}", outcome.summary);
    assert_eq!(outcome.total(), 0, "violations:\n{}", outcome.summary);
    for needle in ["stale-owner ops (0 refused)", "items: 0 "] {
        assert!(
            !outcome.summary.contains(needle),
            "the run did not exercise enough ({needle}):\n{}",
            outcome.summary
        );
    }
}

/// The CI run: 30 s of every fault, then the checker; no violation allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_workload_survives_faults() {
    let outcome = run(Params {
        label: "CI",
        seed: seed(),
        fault_secs: 30,
        workers: 3,
        tasks: 3,
        driver: Driver::Sql,
        fenced: true,
        break_name: break_name(),
    })
    .await;
    assert_clean(&outcome);
}

/// The same faults with the workload run by `pg_lease_client::Worker`
/// (3 processes × 3 slots): its claims, heartbeats, local deadlines,
/// reconnects and fenced transactions under SIGSTOP, kill -9, terminated
/// sessions, a cut, delayed and partitioned proxy, and server restarts.
/// New with the Worker rework (the suite drove only hand-written SQL before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_survives_faults() {
    let outcome = run(Params {
        label: "CI, Worker",
        seed: seed(),
        fault_secs: 30,
        workers: 3,
        tasks: 3,
        driver: Driver::Worker,
        fenced: true,
        break_name: break_name(),
    })
    .await;
    assert_clean(&outcome);
}

/// The same with the Worker's leases bound to its session: a lease that a
/// fault ends early (its process killed, its listening session terminated
/// or cut, the server restarted) is taken over only after the sweep
/// expired it, and every check holds as without binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_worker_survives_faults() {
    let outcome = run(Params {
        label: "CI, Worker with bound sessions",
        seed: seed(),
        fault_secs: 30,
        workers: 3,
        tasks: 3,
        driver: Driver::BoundWorker,
        fenced: true,
        break_name: break_name(),
    })
    .await;
    assert_clean(&outcome);
}

/// The control: the same workload without fencing must be caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_fencing_finds_violations() {
    let outcome = run(Params {
        label: "control (unfenced)",
        seed: seed(),
        fault_secs: 15,
        workers: 3,
        tasks: 3,
        driver: Driver::Sql,
        fenced: false,
        break_name: None,
    })
    .await;
    println!("{}", outcome.summary);
    assert!(
        !outcome.violations["writes_carry_current_epoch"].is_empty(),
        "the checker found no stale write in the unfenced control: the harness is broken\n{}",
        outcome.summary
    );
}

/// The soak: `PG_LEASE_SOAK_SECS` (default 600) of faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long; run by hand: PG_LEASE_SOAK_SECS=600 cargo test -p pg_tests --test faults -- --ignored soak --nocapture"]
async fn soak() {
    let secs = std::env::var("PG_LEASE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let outcome = run(Params {
        label: "soak",
        seed: seed(),
        fault_secs: secs,
        workers: 4,
        tasks: 3,
        driver: soak_driver(),
        fenced: true,
        break_name: break_name(),
    })
    .await;
    assert_clean(&outcome);
}

/// `PG_LEASE_FAULTS_DRIVER=worker` soaks the `Worker` instead, `bound` the
/// `Worker` with bound sessions.
fn soak_driver() -> Driver {
    match std::env::var("PG_LEASE_FAULTS_DRIVER").as_deref() {
        Ok("worker") => Driver::Worker,
        Ok("bound") => Driver::BoundWorker,
        _ => Driver::Sql,
    }
}
