//! The `keys` section: what per-key concurrency costs a drain. The same
//! batch-50 pgbench drain as the `claim` section (16 clients, claim +
//! `release_batch`), of rows without a concurrency key and of rows with
//! one, behind a hot key whose rows wait held at a higher priority: claims
//! must not walk them, and each completion hands its slot on.

use crate::report::{rate, ratio, Results, Table};
use crate::scenarios::{Bench, Res, Side};

/// How the drained rows use concurrency keys.
#[derive(Clone, Copy)]
enum Keys {
    /// No concurrency key, the queue without a limit.
    None,
    /// Every row its own key (limit 1): admitted at once, but each
    /// completion updates its key's slot row.
    Distinct,
    /// 1,000 keys, limit 1: one row per key runs at a time, the next one
    /// is admitted when it ends.
    Shared(u32),
}

impl Keys {
    fn describe(self) -> String {
        match self {
            Keys::None => "no concurrency keys".into(),
            Keys::Distinct => "a key per row, limit 1".into(),
            Keys::Shared(n) => format!("{n} keys, limit 1 (one row per key at a time)"),
        }
    }
}

impl Bench {
    /// Batch-50 drains with and without concurrency keys, side by side.
    pub async fn keys(&self, out: &mut Results) -> Res<()> {
        let rows = Self::whole_cycles(50, 16, self.size.drain_b50 / 10);
        let hot = (self.size.drain_b50 / 2).min(100_000);
        let mut t = Table::new(
            "Per-key concurrency: batch-50 drains (pgbench, 16 clients)",
            &format!(
                "Each drain: {rows} rows enqueued right before it (no VACUUM), then claim_pending(50) + \
                 release_batch until they are gone. With keys, {hot} more rows of one hot key wait \
                 held at priority 1, ahead of every other row in claim order (one of them admitted \
                 at a time); jobs/s counts every row that ended."
            ),
            &["rows", "hot key held rows", "seconds", "jobs/s", "vs no keys"],
        );
        let mut plain = None;
        for keys in [Keys::None, Keys::Distinct, Keys::Shared(1_000)] {
            self.fill_keyed(keys, rows, hot).await?;
            // The hot key's rows need not all go: one runs at a time.
            let stay = if matches!(keys, Keys::None) { 0 } else { hot };
            let drain = self
                .drain_filled(Side::Lease, 50, 16, (rows, stay), false)
                .await?;
            let jobs = drain.jobs_per_s();
            let base = *plain.get_or_insert(jobs);
            if let Keys::Shared(_) = keys {
                out.metrics.insert("keys_shared_vs_plain", jobs / base);
            }
            t.row(vec![
                keys.describe(),
                match keys {
                    Keys::None => "0".into(),
                    _ => hot.to_string(),
                },
                format!("{:.2}", drain.secs),
                rate(jobs),
                ratio(jobs / base),
            ]);
        }
        self.exec("TRUNCATE lease.job, lease.key_slot; SELECT lease.create_queue('q')")
            .await?;
        out.tables.push(t);
        Ok(())
    }

    /// Empties queue `q`, gives it a limit of 1 if `keys` uses keys, and
    /// enqueues the hot key's held rows and then `rows` rows to drain.
    async fn fill_keyed(&self, keys: Keys, rows: u64, hot: u64) -> Res<()> {
        let limit = match keys {
            Keys::None => "NULL",
            _ => "1",
        };
        self.exec(&format!(
            "TRUNCATE lease.job, lease.key_slot, bench_jobs;
             SELECT lease.create_queue('q', concurrency => {limit})"
        ))
        .await?;
        let key_of = match keys {
            Keys::None => "NULL".to_owned(),
            Keys::Distinct => "'row-' || i".to_owned(),
            Keys::Shared(n) => format!("'tenant-' || i % {n}"),
        };
        if !matches!(keys, Keys::None) {
            self.exec(&format!(
                "SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{{}}'::jsonb, ARRAY[{hot}]),
                     priority => 1, concurrency_keys => array_fill('hot'::text, ARRAY[{hot}]))"
            ))
            .await?;
        }
        self.exec(&format!(
            "SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{{\"n\": 1}}'::jsonb, ARRAY[{rows}]),
                 concurrency_keys => ARRAY(SELECT {key_of} FROM generate_series(1, {rows}) i));
             CHECKPOINT"
        ))
        .await
    }
}
