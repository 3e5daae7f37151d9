//! The measurements. Each one resets the tables it uses, fills them, then
//! times the work; every drain checks that the rows really left.

use std::path::Path;
use std::time::{Duration, Instant};

use pg_lease_client::{Client, Connector, FencingToken, Outcome};
use tokio_postgres::NoTls;

use crate::pgbench::{Length, Pgbench, Run};
use crate::report::{rate, ratio, Results, SweepPoint, Table};

/// Errors of the runner: a message for the operator.
pub type Res<T> = Result<T, String>;

pub(crate) fn pg(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

fn client_err(e: pg_lease_client::Error) -> String {
    e.to_string()
}

/// Sizes and durations of one run.
#[derive(Clone, Debug)]
pub struct Size {
    /// Rows drained at batch 50 (16 clients).
    pub drain_b50: u64,
    /// Rows drained at batch 1 (16 clients).
    pub drain_b1: u64,
    /// Seconds of each time-based pgbench run (ceilings, enqueue, renew).
    pub seconds: u64,
    /// Backlogs for claim latency.
    pub backlogs: Vec<u64>,
    /// Timed claims per backlog and batch size.
    pub latency_samples: usize,
    /// Seconds of sustained churn.
    pub churn_seconds: u64,
    /// Rows drained with and without a pinned xmin.
    pub pinned_rows: u64,
    /// Client counts of the concurrency sweep (batch 50).
    pub sweep_clients: Vec<u32>,
    /// Rows the sweep drains per client (capped at `drain_b50`).
    pub sweep_rows_per_client: u64,
    /// Rows the Worker drains (and a tenth of them, and a twentieth as
    /// 10 ms jobs).
    pub worker_rows: u64,
    /// Longest any single drain may take.
    pub deadline: Duration,
    /// Idle databases of the reaper section (half with pg_lease).
    pub idle_databases: u32,
    /// Seconds of each of its quiet windows.
    pub idle_seconds: u64,
    /// Cycles of the longer of the instructions section's two runs.
    pub instruction_cycles: u64,
}

impl Size {
    /// The documented full run (about 12 minutes on 2 cores).
    pub fn full() -> Size {
        Size {
            drain_b50: 200_000,
            drain_b1: 20_000,
            seconds: 10,
            backlogs: vec![1_000, 100_000, 1_000_000],
            latency_samples: 300,
            churn_seconds: 600,
            pinned_rows: 100_000,
            sweep_clients: vec![1, 4, 16, 32],
            sweep_rows_per_client: 12_500,
            worker_rows: 200_000,
            deadline: Duration::from_secs(180),
            idle_databases: 100,
            idle_seconds: 30,
            instruction_cycles: 400,
        }
    }

    /// A quick run that exercises every scenario on tiny sizes (CI).
    pub fn smoke() -> Size {
        Size {
            drain_b50: 3_200,
            drain_b1: 320,
            seconds: 1,
            backlogs: vec![1_000, 10_000],
            latency_samples: 20,
            churn_seconds: 4,
            pinned_rows: 3_200,
            sweep_clients: vec![1, 16],
            sweep_rows_per_client: 200,
            worker_rows: 3_200,
            deadline: Duration::from_secs(60),
            idle_databases: 4,
            idle_seconds: 2,
            instruction_cycles: 8,
        }
    }
}

/// Which implementation a drain runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// pg_lease's functions.
    Lease,
    /// The hand-written seed SQL on `bench_jobs`.
    Hand,
}

impl Side {
    pub(crate) fn script(self, batch: u32) -> &'static str {
        match (self, batch) {
            (Side::Lease, 1) => "lease_b1.sql",
            (Side::Lease, _) => "lease_b50.sql",
            (Side::Hand, 1) => "handwritten_b1.sql",
            (Side::Hand, _) => "handwritten_b50.sql",
        }
    }

    /// The batch-1 script that completes the client's previous job and
    /// claims the next in one transaction.
    fn chained_script(self) -> &'static str {
        match self {
            Side::Lease => "lease_b1_chained.sql",
            Side::Hand => "handwritten_b1_chained.sql",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Side::Lease => "pg_lease",
            Side::Hand => "hand-written",
        }
    }
}

/// A claim table's row: `name`, the drain `d`, and its rate against the
/// hand-written drain `hand` and against `ceiling` (rows/s).
fn drain_row(name: &str, d: Drain, hand: Drain, ceiling: f64) -> Vec<String> {
    let mut cells = vec![name.to_owned()];
    cells.extend(d.cells());
    cells.push(ratio(d.jobs_per_s() / hand.jobs_per_s()));
    cells.push(ratio(d.jobs_per_s() / ceiling));
    cells
}

/// One timed drain.
#[derive(Clone, Copy, Debug)]
pub struct Drain {
    /// Rows enqueued before the drain.
    pub rows: u64,
    /// Rows gone afterwards.
    pub drained: u64,
    /// Wall time, connections (worker start-up) included.
    pub secs: f64,
    /// Killed at the deadline.
    pub timed_out: bool,
}

impl Drain {
    /// Rows drained per second of wall time.
    pub fn jobs_per_s(&self) -> f64 {
        self.drained as f64 / self.secs.max(1e-9)
    }

    fn cells(&self) -> Vec<String> {
        let mut secs = format!("{:.2}", self.secs);
        if self.timed_out {
            secs.push_str(" (deadline)");
        }
        vec![
            self.rows.to_string(),
            self.drained.to_string(),
            secs,
            rate(self.jobs_per_s()),
        ]
    }
}

/// The benchmark context: one cluster, an admin connection, pgbench.
pub struct Bench {
    /// Connection string of the benchmark database.
    pub conn: String,
    /// Admin connection (superuser) for setup and checks.
    pub admin: tokio_postgres::Client,
    /// pgbench, pointed at the cluster.
    pub pgbench: Pgbench,
    /// Sizes of this run.
    pub size: Size,
}

impl Bench {
    pub(crate) async fn exec(&self, sql: &str) -> Res<()> {
        self.admin
            .batch_execute(sql)
            .await
            .map_err(|e| format!("{sql}: {}", pg(e)))
    }

    pub(crate) async fn scalar_i64(&self, sql: &str) -> Res<i64> {
        let row = self
            .admin
            .query_one(sql, &[])
            .await
            .map_err(|e| format!("{sql}: {}", pg(e)))?;
        Ok(row.get(0))
    }

    /// Creates the hand-written baseline's and the ceiling's tables and the
    /// queue `q` (`pgbench/setup.sql`).
    pub(crate) async fn create_tables(admin: &tokio_postgres::Client, scripts: &Path) -> Res<()> {
        let path = scripts.join("setup.sql");
        let sql =
            std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
        admin
            .batch_execute(&sql)
            .await
            .map_err(|e| format!("setup.sql: {}", pg(e)))
    }

    /// Empties both job tables (TRUNCATE: each scenario starts unbloated).
    async fn reset(&self) -> Res<()> {
        self.exec("TRUNCATE lease.job, bench_jobs").await
    }

    /// Enqueues `n` rows into queue `q` through `lease.enqueue_batch`.
    pub(crate) async fn fill_lease(&self, n: u64) -> Res<()> {
        let mut left = n;
        while left > 0 {
            let chunk = left.min(50_000) as i32;
            self.admin
                .execute(
                    "SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{\"n\": 1}'::jsonb, ARRAY[$1::int]))",
                    &[&chunk],
                )
                .await
                .map_err(|e| format!("enqueue_batch: {}", pg(e)))?;
            left -= chunk as u64;
        }
        Ok(())
    }

    /// Inserts `n` pending rows into the hand-written table.
    async fn fill_hand(&self, n: u64) -> Res<()> {
        let n = n as i64;
        self.admin
            .execute(
                "INSERT INTO bench_jobs (queue, payload) SELECT 'q', '{\"n\": 1}' FROM generate_series(1, $1::bigint)",
                &[&n],
            )
            .await
            .map_err(|e| format!("insert bench_jobs: {}", pg(e)))?;
        Ok(())
    }

    /// Vacuums and checkpoints, so that every timed run starts alike.
    async fn settle(&self) -> Res<()> {
        // One statement per call: VACUUM refuses to run in the implicit
        // transaction of a multi-statement query.
        for sql in [
            "VACUUM ANALYZE lease.job",
            "VACUUM ANALYZE bench_jobs",
            "CHECKPOINT",
        ] {
            self.exec(sql).await?;
        }
        Ok(())
    }

    pub(crate) async fn remaining(&self, side: Side) -> Res<u64> {
        let sql = match side {
            Side::Lease => "SELECT count(*) FROM lease.job WHERE queue = 'q'",
            Side::Hand => "SELECT count(*) FROM bench_jobs",
        };
        Ok(self.scalar_i64(sql).await? as u64)
    }

    /// Empties both tables and enqueues `n` rows on one side, as users
    /// do: no VACUUM before the drain, only a CHECKPOINT, so that no drain
    /// inherits another's checkpoint.
    pub(crate) async fn fill(&self, side: Side, n: u64) -> Res<()> {
        self.reset().await?;
        match side {
            Side::Lease => self.fill_lease(n).await?,
            Side::Hand => self.fill_hand(n).await?,
        }
        self.exec("CHECKPOINT").await
    }

    /// Opens a session that holds a snapshot (REPEATABLE READ, one query
    /// run, then idle in transaction), pinning the cluster's xmin.
    async fn pin_xmin(&self) -> Res<tokio_postgres::Client> {
        let pin = connect(&self.conn).await?;
        pin.batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM bench_ceiling",
        )
        .await
        .map_err(pg)?;
        let pinned = self
            .scalar_i64(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE state = 'idle in transaction' AND backend_xmin IS NOT NULL",
            )
            .await?;
        if pinned == 0 {
            return Err("the pinning session holds no xmin".to_owned());
        }
        Ok(pin)
    }

    /// Fills `rows` (rounded up to whole cycles) and drains them with
    /// pgbench: `batch` rows per claim, `clients` clients.
    pub async fn pgbench_drain(
        &self,
        side: Side,
        batch: u32,
        clients: u32,
        rows: u64,
        pinned: bool,
    ) -> Res<Drain> {
        let rows = Self::whole_cycles(batch, clients, rows);
        self.fill(side, rows).await?;
        self.drain_filled(side, batch, clients, (rows, 0), pinned)
            .await
    }

    /// `rows` rounded up to whole pgbench cycles of `batch × clients`.
    pub(crate) fn whole_cycles(batch: u32, clients: u32, rows: u64) -> u64 {
        let per_cycle = u64::from(batch) * u64::from(clients);
        rows.div_ceil(per_cycle).max(1) * per_cycle
    }

    /// The drain of [`Bench::pgbench_drain`], of rows already filled
    /// (`rows` whole cycles), warning if more than `stay` rows are left
    /// (rows filled besides them that the drain need not reach).
    pub(crate) async fn drain_filled(
        &self,
        side: Side,
        batch: u32,
        clients: u32,
        (rows, stay): (u64, u64),
        pinned: bool,
    ) -> Res<Drain> {
        let cycles = rows / (u64::from(batch) * u64::from(clients));
        let script = (side.script(batch), Vec::new());
        self.drain_script(side, script, (clients, cycles), (rows, stay), pinned)
            .await
    }

    /// Fills `rows` (rounded up to whole rounds of 16) and drains them at
    /// batch 1 with 16 clients, one transaction per job: each completes the
    /// client's previous job and claims the next. Every client runs one
    /// transaction more than its share, to complete its last job; a client
    /// that took more than its share leaves its last job claimed.
    pub(crate) async fn chained_drain(&self, side: Side, rows: u64) -> Res<Drain> {
        let rows = Self::whole_cycles(1, 16, rows);
        self.fill(side, rows).await?;
        let first = vec![
            ("id".to_owned(), "0".to_owned()),
            ("epoch".to_owned(), "0".to_owned()),
        ];
        let script = (side.chained_script(), first);
        self.drain_script(side, script, (16, rows / 16 + 1), (rows, 16), false)
            .await
    }

    /// Runs `script` (a pgbench file and its variables) on `clients`
    /// clients, `transactions` each, over `rows` filled rows, warning if
    /// more than `stay` are left; with `pinned`, a snapshot is held
    /// throughout.
    async fn drain_script(
        &self,
        side: Side,
        (script, defines): (&'static str, Vec<(String, String)>),
        (clients, transactions): (u32, u64),
        (rows, stay): (u64, u64),
        pinned: bool,
    ) -> Res<Drain> {
        let pin = if pinned {
            Some(self.pin_xmin().await?)
        } else {
            None
        };
        let before = self.remaining(side).await?;
        let outcome = self
            .pgbench
            .run(&Run {
                scripts: vec![(script, 1)],
                clients,
                length: Length::Transactions(transactions),
                defines,
                deadline: self.size.deadline,
            })
            .await?;
        let after = self.remaining(side).await?;
        if let Some(pin) = pin {
            pin.batch_execute("COMMIT").await.map_err(pg)?;
        }
        if after > stay && !outcome.timed_out {
            eprintln!(
                "bench: {} {script}: {after} of {rows} rows left after the drain",
                side.name()
            );
        }
        Ok(Drain {
            rows,
            drained: before - after,
            secs: outcome.wall.as_secs_f64(),
            timed_out: outcome.timed_out,
        })
    }

    /// A time-based pgbench run; returns its tps.
    async fn timed(
        &self,
        scripts: Vec<(&'static str, u32)>,
        clients: u32,
        defines: Vec<(String, String)>,
    ) -> Res<f64> {
        let outcome = self
            .pgbench
            .run(&Run {
                scripts,
                clients,
                length: Length::Seconds(self.size.seconds),
                defines,
                deadline: Duration::from_secs(self.size.seconds + 60),
            })
            .await?;
        Ok(outcome.tps)
    }

    /// 1-row and 50-row primary-key UPDATE throughput: the commit-bound
    /// ceilings.
    async fn ceiling(&self, rows: u32, clients: u32) -> Res<f64> {
        self.exec("VACUUM ANALYZE bench_ceiling").await?;
        self.exec("CHECKPOINT").await?;
        let script = if rows == 1 {
            "ceiling_1row.sql"
        } else {
            "ceiling_50row.sql"
        };
        Ok(self.timed(vec![(script, 1)], clients, Vec::new()).await? * f64::from(rows))
    }

    /// Claim + complete drains at batch 50 and 1, both sides, and the
    /// ceilings, 16 clients.
    pub async fn claim_complete(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Claim + complete, pgbench, 16 clients",
            "Each cycle is two transactions: the claim (one statement), then the completion \
             (one statement) with the ids the claim returned (`\\gset`). pg_lease: \
             `claim_pending` + `release_batch` (batch 50) or `release` (batch 1); hand-written: \
             CTE `FOR UPDATE SKIP LOCKED` + `DELETE`. The rows \"one transaction per job\" \
             complete the previous job and claim the next in one statement: pg_lease's \
             `release_and_claim`, the hand-written `DELETE` as a CTE of its claim; their \
             \"vs hand-written\" is against the hand-written row of the same kind. Rows are \
             enqueued first, then the drain to zero is timed (connections included). \
             Ceilings: one primary-key UPDATE per transaction, time-based, in rows/s.",
            &[
                "scenario",
                "rows",
                "drained",
                "seconds",
                "jobs/s",
                "vs hand-written",
                "vs ceiling",
            ],
        );
        let c50 = self.ceiling(50, 16).await?;
        let c1 = self.ceiling(1, 16).await?;
        out.metrics.insert("ceiling_50_rows", c50);
        out.metrics.insert("ceiling_1_rows", c1);
        // Batch 50 at the full size and at a tenth of it (the targets ask for
        // both: a short drain meets rows that were just inserted).
        for (batch, rows) in [
            (50, self.size.drain_b50),
            (50, self.size.drain_b50 / 10),
            (1, self.size.drain_b1),
        ] {
            let small = batch == 50 && rows < self.size.drain_b50;
            let hand = self
                .pgbench_drain(Side::Hand, batch, 16, rows, false)
                .await?;
            let lease = self
                .pgbench_drain(Side::Lease, batch, 16, rows, false)
                .await?;
            let ceiling = if batch == 1 { c1 } else { c50 };
            for (side, d) in [(Side::Lease, lease), (Side::Hand, hand)] {
                t.row(drain_row(
                    &format!("{} batch {batch}", side.name()),
                    d,
                    hand,
                    ceiling,
                ));
            }
            let (lk, hk) = match (batch, small) {
                (1, _) => ("lease_b1", "hand_b1"),
                (_, true) => ("lease_b50_small", "hand_b50_small"),
                _ => ("lease_b50", "hand_b50"),
            };
            out.metrics.insert(lk, lease.jobs_per_s());
            out.metrics.insert(hk, hand.jobs_per_s());
            if batch == 50 && !small {
                out.sweep.push(SweepPoint {
                    clients: 16,
                    lease: lease.jobs_per_s(),
                    hand: hand.jobs_per_s(),
                    ceiling: c50,
                });
            }
        }
        // Batch 1 again, one transaction per job on both sides: whether
        // release_and_claim (the Worker's cycle) gains on two commits.
        let hand = self.chained_drain(Side::Hand, self.size.drain_b1).await?;
        let lease = self.chained_drain(Side::Lease, self.size.drain_b1).await?;
        for (side, d) in [(Side::Lease, lease), (Side::Hand, hand)] {
            let name = format!("{} batch 1, one transaction per job", side.name());
            t.row(drain_row(&name, d, hand, c1));
        }
        for (name, v) in [
            ("ceiling: 50-row PK UPDATE", c50),
            ("ceiling: 1-row PK UPDATE", c1),
        ] {
            t.row(vec![
                name.to_owned(),
                "—".into(),
                "—".into(),
                format!("{}", self.size.seconds),
                format!("{} rows/s", rate(v)),
                "—".into(),
                "1.00×".into(),
            ]);
        }
        out.tables.push(t);
        Ok(())
    }

    /// Enqueue throughput, single and batch of 50, both sides.
    pub async fn enqueue(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Enqueue, pgbench, 16 clients",
            "Time-based; one transaction per call. pg_lease's enqueue also sends \
             a `NOTIFY` on the queue's channel when it makes the queue non-empty.",
            &["scenario", "transactions/s", "rows/s", "vs hand-written"],
        );
        let cases: [(&str, &'static str, &'static str, f64); 2] = [
            (
                "single",
                "lease_enqueue.sql",
                "handwritten_enqueue.sql",
                1.0,
            ),
            (
                "batch 50",
                "lease_enqueue_b50.sql",
                "handwritten_enqueue_b50.sql",
                50.0,
            ),
        ];
        for (name, lease_script, hand_script, per) in cases {
            self.reset().await?;
            self.settle().await?;
            let hand = self.timed(vec![(hand_script, 1)], 16, Vec::new()).await?;
            self.reset().await?;
            self.settle().await?;
            let lease = self.timed(vec![(lease_script, 1)], 16, Vec::new()).await?;
            t.row(vec![
                format!("pg_lease enqueue {name}"),
                rate(lease),
                rate(lease * per),
                ratio(lease / hand),
            ]);
            t.row(vec![
                format!("hand-written INSERT {name}"),
                rate(hand),
                rate(hand * per),
                "1.00×".into(),
            ]);
        }
        out.tables.push(t);
        Ok(())
    }

    async fn table_updates(&self, table: &str) -> Res<(i64, i64)> {
        // Statistics are flushed by backends when they exit and at most once
        // a second otherwise; a fresh snapshot is taken per statement.
        let row = self
            .admin
            .query_one(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
                  WHERE relid = $1::text::regclass",
                &[&table],
            )
            .await
            .map_err(pg)?;
        Ok((row.get(0), row.get(1)))
    }

    /// Waits until backends have sent their statistics, and drops the
    /// cached ones.
    pub(crate) async fn flushed_stats(&self) -> Res<()> {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        self.exec("SELECT pg_stat_clear_snapshot()").await
    }

    /// Renew throughput and the share of renewals that are HOT updates.
    pub async fn renew(&self, out: &mut Results) -> Res<()> {
        const PER_CLIENT: i64 = 64;
        let clients: i64 = 16;
        let mut t = Table::new(
            "Renew, pgbench, 16 clients",
            "Each client holds 64 leases and renews a random one per transaction. HOT share: \
             `n_tup_hot_upd / n_tup_upd` of the table over the run (pg_stat_user_tables).",
            &[
                "scenario",
                "renewals/s",
                "updates",
                "HOT updates",
                "HOT share",
            ],
        );
        self.reset().await?;
        self.fill_lease((clients * PER_CLIENT) as u64).await?;
        let base = self
            .scalar_i64("SELECT min(id) FROM lease.job WHERE queue = 'q'")
            .await?;
        let mut epoch = None;
        for c in 0..clients {
            let owner = format!("bench-{c}");
            let rows = self
                .admin
                .query(
                    "SELECT id, epoch FROM lease.claim_pending($1::int, '1 hour', $2::text, 'q')",
                    &[&(PER_CLIENT as i32), &owner],
                )
                .await
                .map_err(pg)?;
            for (i, row) in rows.iter().enumerate() {
                let (id, e): (i64, i64) = (row.get(0), row.get(1));
                if id != base + c * PER_CLIENT + i as i64 || epoch.is_some_and(|x| x != e) {
                    return Err(format!(
                        "renew setup: client {c} got row {id} epoch {e}, not the expected layout"
                    ));
                }
                epoch = Some(e);
            }
        }
        let epoch = epoch.ok_or("renew setup: nothing claimed")?;
        // The hand-written side: 1024 running rows, ids 1..=1024.
        self.exec("TRUNCATE bench_jobs RESTART IDENTITY").await?;
        self.fill_hand((clients * PER_CLIENT) as u64).await?;
        self.exec(
            "UPDATE bench_jobs SET status = 'running', claimed_until = now() + interval '1 hour'",
        )
        .await?;
        self.settle().await?;

        let cases = [
            ("pg_lease renew", "lease.job", "lease_renew.sql"),
            (
                "hand-written UPDATE claimed_until",
                "bench_jobs",
                "handwritten_renew.sql",
            ),
        ];
        for (name, table, script) in cases {
            self.flushed_stats().await?;
            let (upd0, hot0) = self.table_updates(table).await?;
            let defines = vec![
                ("base".to_owned(), base.to_string()),
                ("epoch".to_owned(), epoch.to_string()),
            ];
            let tps = self
                .timed(vec![(script, 1)], clients as u32, defines)
                .await?;
            self.flushed_stats().await?;
            let (upd1, hot1) = self.table_updates(table).await?;
            let (upd, hot) = (upd1 - upd0, hot1 - hot0);
            let share = hot as f64 / (upd.max(1)) as f64;
            if table == "lease.job" {
                out.metrics.insert("renew_hot_share", share);
                out.metrics.insert("renew_per_s", tps);
                let held = self
                    .scalar_i64("SELECT count(*) FROM lease.job WHERE state = 'leased'")
                    .await?;
                if held != clients * PER_CLIENT {
                    return Err(format!(
                        "renew: {held} leases held afterwards, expected {}",
                        clients * PER_CLIENT
                    ));
                }
            }
            t.row(vec![
                name.to_owned(),
                rate(tps),
                upd.to_string(),
                hot.to_string(),
                format!("{:.1}%", share * 100.0),
            ]);
        }
        out.tables.push(t);
        Ok(())
    }

    /// The same claim + complete SQL through the Rust client: 16 tasks,
    /// each with its own connection, claim then release until empty; with
    /// `prepared` false, as behind a transaction-mode pooler
    /// (`Connector::with_prepared_statements(false)`).
    async fn client_drain(&self, batch: u32, rows: u64, prepared: bool) -> Res<Drain> {
        self.fill(Side::Lease, rows).await?;
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..16 {
            let conn = self.conn.clone();
            tasks.spawn(async move {
                let connector = Connector::no_tls(&conn)
                    .map_err(client_err)?
                    .with_prepared_statements(prepared);
                let client = Client::with_connector(connector);
                let owner = format!("client-{c}");
                let ttl = Duration::from_secs(30);
                loop {
                    let claimed = client
                        .claim(batch, ttl, &owner, "q")
                        .await
                        .map_err(client_err)?;
                    match claimed.as_slice() {
                        [] => return Ok::<(), String>(()),
                        [one] => client
                            .release(&one.lease, &Outcome::Done)
                            .await
                            .map_err(client_err)?,
                        many => {
                            let tokens: Vec<FencingToken> =
                                many.iter().map(|c| c.lease.token()).collect();
                            client
                                .release_batch(&owner, &tokens, "q", &Outcome::Done)
                                .await
                                .map_err(client_err)?;
                        }
                    }
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.map_err(|e| format!("client task: {e}"))??;
        }
        let secs = started.elapsed().as_secs_f64();
        let left = self.remaining(Side::Lease).await?;
        Ok(Drain {
            rows,
            drained: rows - left,
            secs,
            timed_out: false,
        })
    }

    /// Rust client drains (the Worker has its own section, `worker.rs`).
    pub async fn client(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Rust client (pg_lease_client), 16 connections",
            "16 tasks, each with its own `Client`, loop `claim` → `release_batch` (or `release` \
             at batch 1) until a claim comes back empty — the SQL of the pgbench pg_lease rows \
             above. \"unprepared\": the client as behind a transaction-mode pooler \
             (`Connector::with_prepared_statements(false)`: each call sent unnamed with its \
             parameter types), connected directly all the same.",
            &[
                "scenario",
                "rows",
                "drained",
                "seconds",
                "jobs/s",
                "vs pgbench same SQL",
            ],
        );
        for (batch, rows, prepared, key, pgb) in [
            (50, self.size.drain_b50, true, "client_b50", "lease_b50"),
            (
                50,
                self.size.drain_b50,
                false,
                "client_b50_unprepared",
                "lease_b50",
            ),
            (1, self.size.drain_b1, true, "client_b1", "lease_b1"),
            (
                1,
                self.size.drain_b1,
                false,
                "client_b1_unprepared",
                "lease_b1",
            ),
        ] {
            let d = self.client_drain(batch, rows, prepared).await?;
            out.metrics.insert(key, d.jobs_per_s());
            let how = if prepared { "" } else { ", unprepared" };
            let mut cells = vec![format!("client drain batch {batch}{how}")];
            cells.extend(d.cells());
            cells.push(
                out.metrics
                    .get(pgb)
                    .map(|p| ratio(d.jobs_per_s() / p))
                    .unwrap_or_else(|| "—".into()),
            );
            t.row(cells);
        }
        out.tables.push(t);
        Ok(())
    }

    /// Claim latency (one connection) at several backlogs, both sides. The
    /// backlog is kept constant: after each timed claim the rows are
    /// completed and as many new ones enqueued, untimed.
    pub async fn latency(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Claim latency vs backlog (one connection)",
            "One connection, prepared statements. Each sample times one claim statement \
             (round trip included); then, untimed, the claimed rows are completed and as many \
             new rows enqueued, so the backlog stays constant and the head of the index \
             collects dead entries as in real use.",
            &[
                "scenario", "backlog", "samples", "p50 ms", "p95 ms", "p99 ms",
            ],
        );
        let conn = connect(&self.conn).await?;
        let lease_claim = conn
            .prepare("SELECT coalesce(array_agg(id), '{}'), coalesce(array_agg(epoch), '{}') FROM lease.claim_pending($1::int, '30 seconds', 'latency', 'q')")
            .await
            .map_err(pg)?;
        let lease_done = conn
            .prepare(
                "SELECT count(*) FROM lease.release_batch($1::bigint[], 'latency', $2::bigint[])",
            )
            .await
            .map_err(pg)?;
        let lease_refill = conn
            .prepare("SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{\"n\": 1}'::jsonb, ARRAY[$1::int]))")
            .await
            .map_err(pg)?;
        let hand_claim = conn
            .prepare(
                "WITH c AS (SELECT id FROM bench_jobs \
                  WHERE status = 'pending' OR (status = 'running' AND claimed_until < now()) \
                  ORDER BY id LIMIT $1::int FOR UPDATE SKIP LOCKED), \
                  u AS (UPDATE bench_jobs j SET status = 'running', claimed_until = now() + interval '30 seconds', \
                  attempts = j.attempts + 1 FROM c WHERE j.id = c.id RETURNING j.id) \
                 SELECT coalesce(array_agg(id), '{}') FROM u",
            )
            .await
            .map_err(pg)?;
        let hand_done = conn
            .prepare("DELETE FROM bench_jobs WHERE id = ANY ($1::bigint[])")
            .await
            .map_err(pg)?;
        let hand_refill = conn
            .prepare("INSERT INTO bench_jobs (queue, payload) SELECT 'q', '{\"n\": 1}' FROM generate_series(1, $1::int)")
            .await
            .map_err(pg)?;

        let largest = self.size.backlogs.iter().copied().max().unwrap_or(0);
        for &backlog in &self.size.backlogs {
            // Both tables filled at once: one settle per backlog.
            self.reset().await?;
            self.fill_lease(backlog).await?;
            self.fill_hand(backlog).await?;
            self.settle().await?;
            for side in [Side::Lease, Side::Hand] {
                for batch in [1_i32, 50] {
                    let mut samples = Vec::with_capacity(self.size.latency_samples);
                    for _ in 0..self.size.latency_samples {
                        match side {
                            Side::Lease => {
                                let t0 = Instant::now();
                                let row =
                                    conn.query_one(&lease_claim, &[&batch]).await.map_err(pg)?;
                                samples.push(t0.elapsed());
                                let (ids, epochs): (Vec<i64>, Vec<i64>) = (row.get(0), row.get(1));
                                conn.execute(&lease_done, &[&ids, &epochs])
                                    .await
                                    .map_err(pg)?;
                                conn.execute(&lease_refill, &[&(ids.len() as i32)])
                                    .await
                                    .map_err(pg)?;
                            }
                            Side::Hand => {
                                let t0 = Instant::now();
                                let row =
                                    conn.query_one(&hand_claim, &[&batch]).await.map_err(pg)?;
                                samples.push(t0.elapsed());
                                let ids: Vec<i64> = row.get(0);
                                conn.execute(&hand_done, &[&ids]).await.map_err(pg)?;
                                conn.execute(&hand_refill, &[&(ids.len() as i32)])
                                    .await
                                    .map_err(pg)?;
                            }
                        }
                    }
                    samples.sort();
                    let q = |p: f64| {
                        let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
                        samples[i.min(samples.len() - 1)].as_secs_f64() * 1000.0
                    };
                    if side == Side::Lease && batch == 1 {
                        if backlog == 1_000 {
                            out.metrics.insert("claim_lat_1e3", q(0.5));
                        }
                        if backlog == largest {
                            out.metrics.insert("claim_lat_largest", q(0.5));
                        }
                    }
                    t.row(vec![
                        format!("{} claim batch {batch}", side.name()),
                        backlog.to_string(),
                        samples.len().to_string(),
                        format!("{:.3}", q(0.5)),
                        format!("{:.3}", q(0.95)),
                        format!("{:.3}", q(0.99)),
                    ]);
                }
            }
        }
        out.tables.push(t);
        Ok(())
    }

    /// Throughput with and without a pinned xmin, both sides, batch 50.
    pub async fn pinned(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Pinned xmin: batch 50 drain, 16 clients, with and without an open snapshot",
            "With: another session runs `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT …` \
             and stays idle in that transaction for the whole drain, so no row version \
             deleted or updated during the drain can be removed.",
            &[
                "scenario",
                "rows",
                "drained",
                "seconds",
                "jobs/s",
                "pinned / unpinned",
            ],
        );
        for side in [Side::Lease, Side::Hand] {
            let free = self
                .pgbench_drain(side, 50, 16, self.size.pinned_rows, false)
                .await?;
            let pinned = self
                .pgbench_drain(side, 50, 16, self.size.pinned_rows, true)
                .await?;
            if side == Side::Lease {
                out.metrics.insert("lease_unpinned", free.jobs_per_s());
                out.metrics.insert("lease_pinned", pinned.jobs_per_s());
            }
            for (label, d) in [("without pin", free), ("pinned xmin", pinned)] {
                let mut cells = vec![format!("{} {label}", side.name())];
                cells.extend(d.cells());
                cells.push(ratio(d.jobs_per_s() / free.jobs_per_s()));
                t.row(cells);
            }
        }
        out.tables.push(t);
        Ok(())
    }

    /// Batch-50 drains at several client counts, both sides, and the 50-row
    /// ceiling: the plot's data.
    pub async fn sweep(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Concurrency sweep, batch 50 (the plot)",
            "Rows drained = clients × the per-client amount (capped at the main drain's \
             size); the 16-client point is the main batch-50 drain above when it ran.",
            &[
                "clients",
                "pg_lease jobs/s",
                "hand-written jobs/s",
                "ceiling rows/s",
                "pg_lease / hand",
                "pg_lease / ceiling",
            ],
        );
        for &clients in &self.size.sweep_clients {
            if clients != 16 || !out.sweep.iter().any(|p| p.clients == 16) {
                let rows =
                    (self.size.sweep_rows_per_client * u64::from(clients)).min(self.size.drain_b50);
                let hand = self
                    .pgbench_drain(Side::Hand, 50, clients, rows, false)
                    .await?;
                let lease = self
                    .pgbench_drain(Side::Lease, 50, clients, rows, false)
                    .await?;
                let ceiling = self.ceiling(50, clients).await?;
                out.sweep.push(SweepPoint {
                    clients,
                    lease: lease.jobs_per_s(),
                    hand: hand.jobs_per_s(),
                    ceiling,
                });
            }
        }
        out.sweep.sort_by_key(|p| p.clients);
        for p in &out.sweep {
            t.row(vec![
                p.clients.to_string(),
                rate(p.lease),
                rate(p.hand),
                rate(p.ceiling),
                ratio(p.lease / p.hand),
                ratio(p.lease / p.ceiling),
            ]);
        }
        out.tables.push(t);
        Ok(())
    }
}

/// A plain tokio-postgres connection (its driver task spawned).
pub async fn connect(conn: &str) -> Res<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(conn, NoTls)
        .await
        .map_err(|e| format!("connect {conn}: {}", pg(e)))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("bench: connection ended: {e}");
        }
    });
    Ok(client)
}
