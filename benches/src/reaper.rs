//! The `reaper` section: what the background reaper costs where it has
//! nothing to do. Many idle databases, half of them with pg_lease, and the
//! server's CPU over a quiet window, with the reaper off (the baseline: the
//! checkpointer, autovacuum, ...), on at its defaults, and on with a short
//! `lease.discovery_interval`, so that the rare look into every database
//! (a fork and a connection each) is inside the window and its cost can be
//! read off.

use std::time::Duration;

use crate::cpu::Cpu;
use crate::report::{Results, Table};
use crate::scenarios::{connect, Bench, Res};

/// The databases this section creates are named with this prefix.
const PREFIX: &str = "bench_idle_";

impl Bench {
    /// Server CPU over `idle_seconds` windows with `idle_databases` idle
    /// databases, half with the extension.
    pub async fn reaper(&self, out: &mut Results) -> Res<()> {
        let n = self.size.idle_databases;
        let window = Duration::from_secs(self.size.idle_seconds);
        for i in 0..n {
            // One statement each: neither may run in a transaction block.
            self.exec(&format!("DROP DATABASE IF EXISTS {PREFIX}{i}"))
                .await?;
            self.exec(&format!("CREATE DATABASE {PREFIX}{i}")).await?;
            if i % 2 == 0 {
                let db = connect(&self.conn.replace(
                    &format!("dbname={}", pg_tests::TEST_DB),
                    &format!("dbname={PREFIX}{i}"),
                ))
                .await?;
                db.batch_execute("CREATE EXTENSION pg_lease")
                    .await
                    .map_err(|e| format!("CREATE EXTENSION in {PREFIX}{i}: {e}"))?;
            }
        }
        // Let the installs' first looks and the test database's last sweeps pass.
        tokio::time::sleep(Duration::from_secs(15).min(window)).await;
        let postmaster = self.postmaster().await?;
        let mut t = Table::new(
            "Reaper cost in idle databases",
            &format!(
                "{n} idle databases ({} with pg_lease) besides the benchmark's own; server CPU \
                 (all its processes, exited sweepers included) over {} s with nothing to do, \
                 in % of one core.",
                n.div_ceil(2),
                window.as_secs()
            ),
            &["reaper", "CPU % of one core", "above the baseline"],
        );
        let mut baseline = None;
        for (label, settings) in [
            (
                "off (`lease.reaper_enabled = off`)",
                "lease.reaper_enabled = off",
            ),
            (
                "on, defaults (discovery every 300 s)",
                "lease.reaper_enabled = on",
            ),
            (
                "on, `lease.discovery_interval = 5` (a look into every database every 5 s)",
                "lease.discovery_interval = 5",
            ),
        ] {
            self.exec(&format!("ALTER SYSTEM SET {settings}")).await?;
            self.exec("SELECT pg_reload_conf()").await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = Cpu::now(postmaster);
            tokio::time::sleep(window).await;
            let used = (Cpu::now(postmaster) - before).server;
            let percent = 100.0 * used / window.as_secs_f64();
            let base = *baseline.get_or_insert(percent);
            if label.starts_with("on, defaults") {
                out.metrics
                    .insert("reaper_idle_cpu_percent", percent - base);
            }
            t.row(vec![
                label.to_owned(),
                format!("{percent:.2}"),
                format!("{:.2}", percent - base),
            ]);
        }
        for reset in [
            "ALTER SYSTEM RESET lease.reaper_enabled",
            "ALTER SYSTEM RESET lease.discovery_interval",
            "SELECT pg_reload_conf()",
        ] {
            self.exec(reset).await?;
        }
        for i in 0..n {
            self.exec(&format!("DROP DATABASE {PREFIX}{i}")).await?;
        }
        out.tables.push(t);
        Ok(())
    }
}
