//! The `rate` section: what a rate limit costs a drain. The same pgbench
//! drains as the `claim` section (claim + release), of queue `q` without a
//! limit and with one that never binds (100,000 rows a second): what is
//! measured is the claims counting and recording their rows in the limit's
//! shares, not the limit holding rows back.

use crate::report::{rate, ratio, Results, Table};
use crate::scenarios::{Bench, Res, Side};

impl Bench {
    /// Drains with and without a rate limit, side by side, at 16 clients
    /// and at one.
    pub async fn rate(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Rate limits: drains of a queue with a limit that never binds (pgbench)",
            "Each drain: rows enqueued right before it (no VACUUM), then claim_pending + \
             release_batch (batch 50) or release (batch 1) until they are gone, in queue q \
             without a rate limit and with rate_limit 100000 (per second), above any drain \
             here. Claims of a limited queue count and record their rows in its shares.",
            &[
                "scenario",
                "rows",
                "no limit, jobs/s",
                "limit, jobs/s",
                "limit vs none",
            ],
        );
        for (batch, clients, rows, key) in [
            (50, 16, self.size.drain_b50 / 10, "rate_b50_c16_vs_none"),
            (1, 16, self.size.drain_b1 / 4, "rate_b1_c16_vs_none"),
            (50, 1, self.size.drain_b50 / 20, "rate_b50_c1_vs_none"),
            (1, 1, self.size.drain_b1 / 20, "rate_b1_c1_vs_none"),
        ] {
            self.exec("SELECT lease.create_queue('q')").await?;
            let plain = self
                .pgbench_drain(Side::Lease, batch, clients, rows, false)
                .await?;
            self.exec("SELECT lease.create_queue('q', rate_limit => 100000)")
                .await?;
            let limited = self
                .pgbench_drain(Side::Lease, batch, clients, rows, false)
                .await?;
            let ratio_of = limited.jobs_per_s() / plain.jobs_per_s();
            out.metrics.insert(key, ratio_of);
            t.row(vec![
                format!("batch {batch}, {clients} clients"),
                plain.rows.to_string(),
                rate(plain.jobs_per_s()),
                rate(limited.jobs_per_s()),
                ratio(ratio_of),
            ]);
        }
        self.exec("SELECT lease.create_queue('q')").await?;
        out.tables.push(t);
        Ok(())
    }
}
