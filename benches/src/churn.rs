//! The `churn` section: producers and consumers at once, at the highest
//! rate 16 pgbench clients reach, for `churn_seconds`, with default
//! autovacuum settings and the reaper at its defaults. Samples the size of
//! `lease.job` and its indexes against the size its live rows would take
//! freshly loaded, so that growth that levels off can be told from growth
//! that does not.
//!
//! The producers hold the backlog near [`BACKLOG`] pending rows: they
//! enqueue twice what a consumer takes per cycle, and wait while the queue
//! is full. With free-running producers at the consumers' pace it wandered
//! between a few hundred and 70,000 rows, and the size over the live rows'
//! size said more about that walk than about the table.

use std::time::{Duration, Instant};

use crate::pgbench::{Length, Run};
use crate::report::{rate, ratio, Results, Table};
use crate::scenarios::{pg, Bench, Res, Side};

/// Pending rows at the start and the most the producers fill the queue to;
/// also the fresh load that measures how many bytes a live row takes.
const BACKLOG: u64 = 10_000;

/// Samples taken over the run (plus one at the start).
const SAMPLES: u32 = 20;

/// One look at `lease.job` during the churn.
struct Sample {
    at: Duration,
    heap: i64,
    indexes: i64,
    live: i64,
    dead: i64,
    vacuums: i64,
    autovacuums: i64,
}

impl Sample {
    fn bytes(&self) -> i64 {
        self.heap + self.indexes
    }
}

impl Bench {
    /// Sustained churn: table and index sizes over time, against their live
    /// rows' size.
    pub async fn churn(&self, out: &mut Results) -> Res<()> {
        self.fill(Side::Lease, BACKLOG).await?;
        let fresh = self.sample(Instant::now()).await?;
        let per_row = fresh.bytes() as f64 / BACKLOG as f64;
        self.flushed_stats().await?;
        let totals = "SELECT n_tup_ins, n_tup_del FROM pg_stat_user_tables \
                      WHERE relid = 'lease.job'::regclass";
        let t0 = self.admin.query_one(totals, &[]).await.map_err(pg)?;
        let length = Duration::from_secs(self.size.churn_seconds);
        let run = Run {
            scripts: vec![("lease_enqueue_held.sql", 1), ("lease_b50.sql", 1)],
            clients: 16,
            length: Length::Seconds(self.size.churn_seconds),
            defines: vec![("cap".to_owned(), BACKLOG.to_string())],
            deadline: length + Duration::from_secs(120),
        };
        let (outcome, samples) = tokio::join!(self.pgbench.run(&run), self.samples(length));
        let (outcome, samples) = (outcome?, samples?);
        self.flushed_stats().await?;
        let t1 = self.admin.query_one(totals, &[]).await.map_err(pg)?;
        let secs = outcome.wall.as_secs_f64().max(1e-9);
        let ins = t1.get::<_, i64>(0) - t0.get::<_, i64>(0);
        let del = t1.get::<_, i64>(1) - t0.get::<_, i64>(1);
        let versus_live = |s: &Sample| s.bytes() as f64 / (per_row * s.live.max(1) as f64);

        let mut t = Table::new(
            &format!("Sustained churn: {} s", self.size.churn_seconds),
            &format!(
                "16 pgbench clients, each transaction either `enqueue_batch` of 100 rows (while \
                 fewer than {BACKLOG} rows are pending; else a 1 ms wait) or a batch-50 claim + \
                 `release_batch` (equal weights), starting from {BACKLOG} pending rows; default \
                 autovacuum settings (naptime 1 min), the reaper at its defaults \
                 (`lease.vacuum_dead_rows = 10000`). {ins} rows enqueued and {del} \
                 completed ({}/s each way). A live row takes {per_row:.0} bytes of table and \
                 indexes freshly loaded; \"× live\" is the size over that many bytes per live \
                 row. Vacuums: the reaper's (manual), autovacuum's.",
                rate(del as f64 / secs),
            ),
            &[
                "t (s)",
                "lease.job (kB)",
                "indexes (kB)",
                "live rows",
                "dead rows",
                "× live",
                "vacuums",
                "autovacuums",
            ],
        );
        for s in &samples {
            t.row(vec![
                s.at.as_secs().to_string(),
                (s.heap / 1024).to_string(),
                (s.indexes / 1024).to_string(),
                s.live.to_string(),
                s.dead.to_string(),
                ratio(versus_live(s)),
                (s.vacuums - fresh.vacuums).to_string(),
                (s.autovacuums - fresh.autovacuums).to_string(),
            ]);
        }
        out.tables.push(t);

        // The second half of the run is where the size must have settled.
        let second_half = &samples[samples.len() / 2..];
        if let (Some(mid), Some(last)) = (second_half.first(), samples.last()) {
            let worst = second_half.iter().map(versus_live).fold(0.0, f64::max);
            out.metrics.insert("churn_versus_live", worst);
            out.metrics.insert(
                "churn_late_growth",
                last.bytes() as f64 / mid.bytes() as f64,
            );
        }
        Ok(())
    }

    /// [`SAMPLES`] + 1 samples spread over `length` from now.
    async fn samples(&self, length: Duration) -> Res<Vec<Sample>> {
        let start = Instant::now();
        let mut samples = Vec::new();
        for i in 0..=SAMPLES {
            let at = start + length * i / SAMPLES;
            tokio::time::sleep_until(at.into()).await;
            samples.push(self.sample(start).await?);
        }
        Ok(samples)
    }

    async fn sample(&self, start: Instant) -> Res<Sample> {
        let row = self
            .admin
            .query_one(
                "SELECT pg_relation_size('lease.job'), pg_indexes_size('lease.job'),
                        (SELECT count(*) FROM lease.job),
                        pg_stat_get_dead_tuples('lease.job'::regclass),
                        pg_stat_get_vacuum_count('lease.job'::regclass),
                        pg_stat_get_autovacuum_count('lease.job'::regclass)",
                &[],
            )
            .await
            .map_err(pg)?;
        Ok(Sample {
            at: start.elapsed(),
            heap: row.get(0),
            indexes: row.get(1),
            live: row.get(2),
            dead: row.get(3),
            vacuums: row.get(4),
            autovacuums: row.get(5),
        })
    }
}
