//! The `fairness` section: what fairness keys cost. The same pgbench
//! drains as the `claim` section (16 clients, claim + release), of rows
//! without a fairness key, of rows spread over 10,000 keys, and of those
//! keys each with a rate limit that never binds; and the enqueue that
//! places them. Claims look at no key, so the first two drains should not
//! tell the two apart; an enqueue pays one upsert per key it names, and a
//! claim of limited keys one lock and record per key among its rows.

use std::time::Instant;

use crate::report::{rate, ratio, Results, Table};
use crate::scenarios::{Bench, Res, Side};

/// Fairness keys the keyed rows are spread over.
const KEYS: u32 = 10_000;

impl Bench {
    /// Drains at batch 50 and 1 with and without fairness keys, side by
    /// side, with the enqueues that filled them.
    pub async fn fairness(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Fairness keys: enqueue and drain (pgbench, 16 clients)",
            &format!(
                "Each drain: rows enqueued right before it (no VACUUM) by enqueue_batch calls of up \
                 to 50,000 rows, without fairness keys or with row i of key i % {KEYS}; then \
                 claim_pending + release_batch (batch 50) or release (batch 1) until they are gone."
            ),
            &[
                "scenario",
                "rows",
                "enqueue, rows/s",
                "enqueue vs no keys",
                "drain, jobs/s",
                "drain vs no keys",
            ],
        );
        for (batch, rows, key) in [
            (50, self.size.drain_b50 / 10, "fairness_b50_vs_plain"),
            (1, self.size.drain_b1 / 4, "fairness_b1_vs_plain"),
        ] {
            let rows = Self::whole_cycles(batch, 16, rows);
            let mut base = None;
            for (keyed, limited) in [(false, false), (true, false), (true, true)] {
                let filled = self.fill_fair(rows, keyed).await?;
                if limited {
                    self.exec(&format!(
                        "SELECT count(lease.set_key_rate('q', 'tenant-' || i, 100000))
                           FROM generate_series(0, {}) i",
                        KEYS - 1
                    ))
                    .await?;
                }
                let drain = self
                    .drain_filled(Side::Lease, batch, 16, (rows, 0), false)
                    .await?;
                let (fill0, drain0) = *base.get_or_insert((filled, drain.jobs_per_s()));
                if keyed && !limited {
                    out.metrics.insert(key, drain.jobs_per_s() / drain0);
                }
                t.row(vec![
                    format!(
                        "batch {batch}, {}",
                        match (keyed, limited) {
                            (false, _) => "no keys",
                            (true, false) => "10,000 keys",
                            (true, true) => "10,000 keys, each limited (never binding)",
                        }
                    ),
                    rows.to_string(),
                    rate(filled),
                    ratio(filled / fill0),
                    rate(drain.jobs_per_s()),
                    ratio(drain.jobs_per_s() / drain0),
                ]);
            }
        }
        self.exec("SELECT lease.create_queue('q')").await?;
        out.tables.push(t);
        Ok(())
    }

    /// Empties queue `q` (and its keys) and enqueues `rows` rows, over
    /// [`KEYS`] fairness keys if `keyed`; returns rows enqueued a second.
    async fn fill_fair(&self, rows: u64, keyed: bool) -> Res<f64> {
        self.exec(
            "TRUNCATE lease.job, lease.fairness_key;
             UPDATE lease.queue SET fair = false, key_limited = false WHERE name = 'q'; CHECKPOINT",
        )
        .await?;
        let keys = if keyed {
            format!("ARRAY(SELECT 'tenant-' || i % {KEYS} FROM generate_series(1, $1::int) i)")
        } else {
            "NULL".to_owned()
        };
        let sql = format!(
            "SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{{\"n\": 1}}'::jsonb, ARRAY[$1::int]),
                 fairness_keys => {keys})"
        );
        let started = Instant::now();
        let mut left = rows;
        while left > 0 {
            let chunk = left.min(50_000) as i32;
            self.admin
                .execute(&sql, &[&chunk])
                .await
                .map_err(|e| format!("enqueue_batch: {}", crate::scenarios::pg(e)))?;
            left -= chunk as u64;
        }
        Ok(rows as f64 / started.elapsed().as_secs_f64())
    }
}
