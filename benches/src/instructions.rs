//! The `instructions` section: what one job costs the server's backend,
//! counted in CPU instructions by valgrind's callgrind rather than timed.
//!
//! This machine's CPU is shared (0–24% steal within single runs), so timed
//! drains of the same code differ by ±15% and a change worth 5% cannot be
//! seen in them. An instruction count does not depend on what else the
//! machine does: the same script on the same rows counts the same within a
//! few percent. It does not weigh waits (commits, locks) or the client's
//! side, so it says what a job costs a backend, not what a drain reaches.
//!
//! A second cluster with the benchmark's settings is restarted with its
//! postgres under callgrind (autovacuum and the reaper off, so that only
//! the measured backend runs). One pgbench client runs a script for a
//! quarter of `instruction_cycles` and then for all of them, each from
//! freshly enqueued and analysed rows; the difference between the two
//! backends' counts, over the difference in cycles, leaves out connection
//! set-up and first-use catalog reads. pg_lease is counted twice: as
//! benchmarked elsewhere (done rows deleted) and with its queue keeping done
//! rows, where a completion is an UPDATE.
//!
//! Under callgrind a backend runs some 50 times slower, so what is rationed
//! by time happens more often per job: a claim raises its queue's head at
//! most every 50 ms (head.sql), which here is nearly every claim (about
//! 100,000 instructions each) and at full speed about one claim in a
//! hundred. pg_lease's batch-1 count is high by that much.

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pg_tests::{Cluster, TEST_DB};

use crate::pgbench::{Length, Pgbench, Run};
use crate::report::{ratio, Results, Table};
use crate::scenarios::{connect, pg, Bench, Res, Side};

impl Bench {
    /// Instructions per job of pg_lease's and the hand-written claim +
    /// completion, at batch 1 and 50, on a cluster of its own.
    pub async fn instructions(&self, out: &mut Results) -> Res<()> {
        let cluster = pg_lease_benches::start_cluster();
        let counted = self.counting(&cluster).await?;
        let mut t = Table::new(
            "Instructions per job (callgrind)",
            &format!(
                "One pgbench client, claim + completion as in the drains above; the \
                 backend's instructions per job, over {} minus {} cycles, each run on \
                 freshly enqueued and analysed rows (a quarter more than it takes), under \
                 valgrind's callgrind (autovacuum and the reaper off). Not timed: the \
                 count does not change with the machine's load. pg_lease's batch 1 \
                 includes a head raise on most claims (~0.1M instructions), which runs \
                 at most every 50 ms and is rare at full speed. \"Done rows kept\": \
                 the same with the queue's retention at an hour, so that a completion \
                 marks its row done (an UPDATE) instead of deleting it.",
                self.size.instruction_cycles,
                self.size.instruction_cycles / 4,
            ),
            &[
                "batch",
                "pg_lease",
                "hand-written",
                "pg_lease / hand-written",
                "pg_lease, done rows kept",
                "kept / deleted",
            ],
        );
        for batch in [1u32, 50] {
            let lease = counted.per_job(Side::Lease, batch).await?;
            let kept = counted.keeping_done_rows(batch).await?;
            let hand = counted.per_job(Side::Hand, batch).await?;
            let key = if batch == 1 {
                "instr_ratio_b1"
            } else {
                "instr_ratio_b50"
            };
            out.metrics.insert(key, lease / hand);
            t.row(vec![
                batch.to_string(),
                format!("{lease:.0}"),
                format!("{hand:.0}"),
                ratio(lease / hand),
                format!("{kept:.0}"),
                ratio(kept / lease),
            ]);
        }
        out.tables.push(t);
        Ok(())
    }

    /// `cluster` set up like the benchmark's and restarted under callgrind,
    /// with a [`Bench`] of its own.
    async fn counting(&self, cluster: &Cluster) -> Res<Counting> {
        // Said here, not as a server that fails to start under a missing wrapper.
        let valgrind = std::process::Command::new("valgrind")
            .arg("--version")
            .output();
        if !valgrind.is_ok_and(|out| out.status.success()) {
            return Err("valgrind not found: the instructions section needs it \
                        (bin/prereqs installs it)"
                .to_owned());
        }
        let dir = cluster.data_dir().join("callgrind");
        std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        // The server's OS user writes the counts and runs the wrapper.
        let owner = std::fs::metadata(cluster.data_dir()).map_err(|e| e.to_string())?;
        std::os::unix::fs::chown(&dir, Some(owner.uid()), Some(owner.gid()))
            .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        let wrapper = dir.join("postgres");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec valgrind --quiet --tool=callgrind --trace-children=yes \
                 --callgrind-out-file={}/%p.out {} \"$@\"\n",
                dir.display(),
                pg_tests::pg_bin_dir().join("postgres").display()
            ),
        )
        .map_err(|e| format!("write {}: {e}", wrapper.display()))?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;

        let conn = cluster.conn_string(TEST_DB);
        let admin = connect(&conn).await?;
        Bench::create_tables(&admin, &self.pgbench.scripts).await?;
        // One statement per call: ALTER SYSTEM refuses a transaction block.
        for sql in [
            "ALTER SYSTEM SET autovacuum = off",
            "ALTER SYSTEM SET lease.reaper_enabled = off",
        ] {
            admin.batch_execute(sql).await.map_err(pg)?;
        }
        drop(admin);
        cluster.restart_under(&wrapper)?;
        let bench = Bench {
            conn: conn.clone(),
            admin: connect(&conn).await?,
            pgbench: Pgbench {
                port: cluster.port(),
                ..self.pgbench.clone()
            },
            size: self.size.clone(),
        };
        Ok(Counting { bench, dir })
    }
}

/// A [`Bench`] on a cluster whose backends run under callgrind, and where
/// their counts go.
struct Counting {
    bench: Bench,
    dir: PathBuf,
}

impl Counting {
    /// Instructions per job of `side` at `batch`.
    async fn per_job(&self, side: Side, batch: u32) -> Res<f64> {
        let long = self.bench.size.instruction_cycles;
        let short = long / 4;
        let few = self.backend(side, batch, short).await?;
        let many = self.backend(side, batch, long).await?;
        Ok((many - few) as f64 / ((long - short) * u64::from(batch)) as f64)
    }

    /// Instructions per job of pg_lease at `batch` with queue `q` keeping
    /// its done rows for an hour: completions mark rows done instead of
    /// deleting them. The queue's policy is put back afterwards.
    async fn keeping_done_rows(&self, batch: u32) -> Res<f64> {
        let policy = |retention: &str| {
            format!("SELECT lease.create_queue('q', retention => interval '{retention}')")
        };
        self.bench.exec(&policy("1 hour")).await?;
        let counted = self.per_job(Side::Lease, batch).await;
        self.bench.exec(&policy("0")).await?;
        counted
    }

    /// The instructions of one pgbench client's backend over `cycles`
    /// cycles, from `cycles × batch` rows (and a quarter more) enqueued.
    async fn backend(&self, side: Side, batch: u32, cycles: u64) -> Res<u64> {
        let b = &self.bench;
        b.fill(side, (cycles + cycles / 4) * u64::from(batch))
            .await?;
        // With autovacuum off nothing else would: the hand-written claim's
        // plan, made per call, depends on the statistics.
        b.exec("ANALYZE lease.job").await?;
        b.exec("ANALYZE bench_jobs").await?;
        let run = Run {
            scripts: vec![(side.script(batch), 1)],
            clients: 1,
            length: Length::Transactions(cycles),
            defines: Vec::new(),
            deadline: b.size.deadline,
        };
        let run = b.pgbench.run(&run);
        tokio::pin!(run);
        // pgbench's backends, seen while it runs (callgrind names each
        // backend's file after its pid and writes it as the process exits).
        let mut pids = BTreeSet::new();
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                _ = tokio::time::sleep(Duration::from_millis(50)) => {
                    let rows = b
                        .admin
                        .query(
                            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench'",
                            &[],
                        )
                        .await
                        .map_err(pg)?;
                    pids.extend(rows.iter().map(|r| r.get::<_, i32>(0)));
                }
            }
        };
        outcome?;
        let mut most = 0;
        for pid in pids {
            most = most.max(totals(&self.written(pid).await?)?);
        }
        if most == 0 {
            return Err("pgbench's backend was not seen".to_owned());
        }
        Ok(most)
    }

    /// The callgrind output of backend `pid`, once the backend has exited.
    async fn written(&self, pid: i32) -> Res<PathBuf> {
        let path = self.dir.join(format!("{pid}.out"));
        for _ in 0..600 {
            if path.exists() && !Path::new(&format!("/proc/{pid}")).exists() {
                return Ok(path);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("no callgrind output of backend {pid} within 60 s"))
    }
}

/// The `totals:` line of a callgrind output file.
fn totals(path: &Path) -> Res<u64> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| format!("no totals in {}", path.display()))
}
