//! Running `pgbench` against the benchmark cluster and reading its summary.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Command;

/// How long one pgbench run goes on.
#[derive(Clone, Copy, Debug)]
pub enum Length {
    /// `-t N`: N transactions per client (drains: exactly the rows enqueued).
    Transactions(u64),
    /// `-T N`: N seconds.
    Seconds(u64),
}

/// One pgbench invocation.
#[derive(Clone, Debug)]
pub struct Run {
    /// Scripts (file names under `benches/pgbench/`) with their weights.
    pub scripts: Vec<(&'static str, u32)>,
    /// Concurrent clients (`-c`).
    pub clients: u32,
    /// `-t` or `-T`.
    pub length: Length,
    /// `-D name=value` variables.
    pub defines: Vec<(String, String)>,
    /// Kill pgbench after this long (a drain slowed down by a pinned xmin
    /// can take very long); the result then says `timed_out`.
    pub deadline: Duration,
}

/// What one pgbench run reported.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Wall time from spawning pgbench to its exit (connections included).
    pub wall: Duration,
    /// Transactions per second as pgbench computes it (without connection
    /// time); 0 when pgbench was killed.
    pub tps: f64,
    /// pgbench was killed at the deadline.
    pub timed_out: bool,
}

/// Where pgbench is and how it reaches the cluster.
#[derive(Clone, Debug)]
pub struct Pgbench {
    /// The `pgbench` binary.
    pub binary: PathBuf,
    /// Directory of the `.sql` scripts.
    pub scripts: PathBuf,
    /// TCP port of the cluster on 127.0.0.1.
    pub port: u16,
    /// Database name.
    pub db: String,
    /// Directory for pgbench's captured output.
    pub scratch: PathBuf,
}

impl Pgbench {
    /// Runs pgbench once; an error if it fails (not if it is killed at the
    /// deadline).
    pub async fn run(&self, run: &Run) -> Result<Outcome, String> {
        let out_path = self.scratch.join("pgbench.out");
        let err_path = self.scratch.join("pgbench.err");
        let stdout = std::fs::File::create(&out_path)
            .map_err(|e| format!("create {}: {e}", out_path.display()))?;
        let stderr = std::fs::File::create(&err_path)
            .map_err(|e| format!("create {}: {e}", err_path.display()))?;
        let mut cmd = Command::new(&self.binary);
        cmd.args(["-n", "-M", "prepared", "-h", "127.0.0.1", "-U", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(run.clients.to_string())
            // Two threads: this machine has two cores, and one pgbench
            // thread cannot keep 16+ connections busy at batch 1.
            .arg("-j")
            .arg(run.clients.min(2).to_string());
        match run.length {
            Length::Transactions(t) => cmd.arg("-t").arg(t.to_string()),
            Length::Seconds(s) => cmd.arg("-T").arg(s.to_string()),
        };
        for (name, value) in &run.defines {
            cmd.arg("-D").arg(format!("{name}={value}"));
        }
        for (script, weight) in &run.scripts {
            let path = self.scripts.join(script);
            if !path.is_file() {
                return Err(format!("pgbench script {} not found", path.display()));
            }
            cmd.arg("-f").arg(format!("{}@{weight}", path.display()));
        }
        cmd.arg(&self.db)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        // Explicit connection arguments only: libpq variables of the caller's
        // environment must not redirect the benchmark.
        for var in [
            "PGHOST",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGOPTIONS",
            "PGSERVICE",
        ] {
            cmd.env_remove(var);
        }
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", self.binary.display()))?;
        let status = match tokio::time::timeout(run.deadline, child.wait()).await {
            Ok(status) => status.map_err(|e| format!("waiting for pgbench: {e}"))?,
            Err(_) => {
                child
                    .kill()
                    .await
                    .map_err(|e| format!("could not kill pgbench: {e}"))?;
                return Ok(Outcome {
                    wall: started.elapsed(),
                    tps: 0.0,
                    timed_out: true,
                });
            }
        };
        let wall = started.elapsed();
        let out = read(&out_path);
        let err = read(&err_path);
        if !status.success() {
            return Err(format!(
                "pgbench {:?} failed ({status}):\n{out}\n{err}",
                run.scripts
            ));
        }
        let failed = field(&out, "number of failed transactions:").unwrap_or(0.0);
        if failed > 0.0 {
            return Err(format!(
                "pgbench {:?}: {failed} failed transactions:\n{out}\n{err}",
                run.scripts
            ));
        }
        Ok(Outcome {
            wall,
            tps: field(&out, "tps =").ok_or_else(|| format!("no tps in pgbench output:\n{out}"))?,
            timed_out: false,
        })
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The first number after `label` on the first line that starts with it,
/// e.g. `tps = 814.23 (without initial connection time)` or
/// `number of transactions actually processed: 4000/4000`.
fn field(out: &str, label: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.trim_start().starts_with(label))?;
    let rest = line.trim_start()[label.len()..].trim_start();
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn reads_pgbench_summary_fields() {
        let out = "number of transactions actually processed: 4000/4000\n\
                   number of failed transactions: 0 (0.000%)\n\
                   tps = 814.234944 (without initial connection time)\n";
        assert_eq!(
            field(out, "number of transactions actually processed:"),
            Some(4000.0)
        );
        assert_eq!(field(out, "number of failed transactions:"), Some(0.0));
        assert_eq!(field(out, "tps ="), Some(814.234944));
        assert_eq!(field(out, "latency average ="), None);
    }
}
