//! The `metrics` section: what one poll of `lease.metrics` costs at each
//! backlog, beside `lease.queue_stats` (which counts the rows), on one
//! connection.
//!
//! The backlog is made as users make it: rows enqueued, some claimed and
//! left leased, some delayed, nothing vacuumed.

use std::time::Instant;

use crate::report::{Results, Table};
use crate::scenarios::{connect, Bench, Res};

/// Leased and delayed rows at every backlog: metrics reads those.
const LEASED: i32 = 500;
const DELAYED: i32 = 1_000;

impl Bench {
    /// Median and p95 of `samples` polls of each view at each backlog.
    pub async fn metrics(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Metrics poll cost vs backlog (one connection)",
            "One connection; each sample is one `SELECT * FROM` the view, round trip \
             included (100 samples of metrics, 10 of queue_stats). At each backlog 500 rows are leased and 1,000 delayed (run_at \
             in a day); the rest are ready. No VACUUM after the fill.",
            &["view", "backlog", "samples", "p50 ms", "p95 ms"],
        );
        let conn = connect(&self.conn).await?;
        let samples = self.size.latency_samples.min(100);
        for &backlog in &self.size.backlogs {
            self.exec("TRUNCATE lease.job, lease.counter").await?;
            self.fill_lease(backlog).await?;
            self.exec(&format!(
                "SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{{}}'::jsonb, ARRAY[{DELAYED}]),
                                                          run_at => now() + interval '1 day');
                 SELECT count(*) FROM lease.claim_pending({LEASED}, '1 hour', 'metrics', 'q');
                 CHECKPOINT"
            ))
            .await?;
            // The TRUNCATE dropped the counters: the gauges start from the
            // rows, as after an upgrade.
            self.exec("SELECT lease.recount()").await?;
            // queue_stats reads every row: a few samples tell its cost.
            for (view, samples) in [
                ("lease.metrics", samples),
                ("lease.queue_stats", samples.min(10)),
            ] {
                let sql = format!("SELECT * FROM {view}");
                let statement = conn.prepare(&sql).await.map_err(|e| e.to_string())?;
                let mut ms = Vec::with_capacity(samples);
                // The first poll plans and warms the caches; not counted.
                conn.query(&statement, &[])
                    .await
                    .map_err(|e| e.to_string())?;
                for _ in 0..samples {
                    let t0 = Instant::now();
                    conn.query(&statement, &[])
                        .await
                        .map_err(|e| e.to_string())?;
                    ms.push(t0.elapsed().as_secs_f64() * 1000.0);
                }
                ms.sort_by(f64::total_cmp);
                let q = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
                if view == "lease.metrics" {
                    out.metrics.insert(metric_name(backlog), q(0.5));
                }
                t.row(vec![
                    format!("`{view}`"),
                    (backlog + DELAYED as u64).to_string(),
                    samples.to_string(),
                    format!("{:.3}", q(0.5)),
                    format!("{:.3}", q(0.95)),
                ]);
            }
        }
        self.exec("TRUNCATE lease.job, lease.counter").await?;
        out.tables.push(t);
        Ok(())
    }
}

/// The report's name for the median metrics poll at `backlog`.
fn metric_name(backlog: u64) -> &'static str {
    match backlog {
        b if b >= 1_000_000 => "metrics_p50_ms_1e6",
        b if b >= 100_000 => "metrics_p50_ms_1e5",
        _ => "metrics_p50_ms_small",
    }
}
