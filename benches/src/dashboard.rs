//! The `dashboard` section: what `pg-lease ui` spends on its pages at each
//! backlog, read from the `Server-Timing` header each answer carries (the
//! handler's time: the client's calls, their round trips, rendering).
//!
//! The backlog is made as users make it: rows enqueued into one queue,
//! some claimed and left leased, some delayed, 100 dead, nothing
//! vacuumed. The dashboard runs as the superuser (rows of a queue need
//! it), with its defaults.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::report::{Results, Table};
use crate::scenarios::{Bench, Res};

/// Leased, delayed and dead rows at every backlog.
const LEASED: i32 = 500;
const DELAYED: i32 = 1_000;
const DEAD: i32 = 100;

impl Bench {
    /// Median and p95 server time of each page at each backlog.
    pub async fn dashboard(&self, out: &mut Results) -> Res<()> {
        let mut t = Table::new(
            "Dashboard pages vs backlog (`pg-lease ui`, server time)",
            "Each sample is one GET of the page on a fresh HTTP connection; the time is the \
             handler's own (`Server-Timing`), database round trips included. One queue holds \
             the backlog; 500 rows leased, 1,000 delayed, 100 dead. No VACUUM after the fill. \
             `after`: a page from the middle of the queue; `state=dead`: a filter whose rows \
             are rare, read through the dead rows' index.",
            &["page", "backlog", "samples", "p50 ms", "p95 ms"],
        );
        let samples = self.size.latency_samples.min(50);
        for &backlog in &self.size.backlogs {
            self.exec("TRUNCATE lease.job, lease.counter").await?;
            self.exec(&format!(
                "SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{{\"n\": 1}}'::jsonb, ARRAY[{DEAD}]));
                 SELECT count(*) FROM lease.claim_pending({DEAD}, '1 hour', 'dashboard', 'q') c,
                        LATERAL lease.release(c.id, 'dashboard', c.epoch, 'fail') r"
            ))
            .await?;
            self.fill_lease(backlog).await?;
            self.exec(&format!(
                "SELECT count(*) FROM lease.enqueue_batch('q', array_fill('{{}}'::jsonb, ARRAY[{DELAYED}]),
                                                          run_at => now() + interval '1 day');
                 SELECT count(*) FROM lease.claim_pending({LEASED}, '1 hour', 'dashboard', 'q');
                 SELECT lease.recount(); CHECKPOINT"
            ))
            .await?;
            let middle = self
                .scalar_i64("SELECT (min(id) + max(id)) / 2 FROM lease.job")
                .await?;
            let job = self.scalar_i64("SELECT max(id) FROM lease.job").await?;
            let ui = Ui::start(&self.conn)?;
            for page in [
                "/".to_owned(),
                "/queues/q".to_owned(),
                format!("/queues/q?after={middle}"),
                "/queues/q?state=dead".to_owned(),
                format!("/jobs/{job}"),
                "/dead?queue=q".to_owned(),
            ] {
                // The first request plans the statements; not counted.
                ui.server_ms(&page)?;
                let mut ms = (0..samples)
                    .map(|_| ui.server_ms(&page))
                    .collect::<Res<Vec<f64>>>()?;
                ms.sort_by(f64::total_cmp);
                let q = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
                if page == "/queues/q" && backlog >= 1_000_000 {
                    out.metrics
                        .insert("dashboard_queue_page_p50_ms_1e6", q(0.5));
                }
                t.row(vec![
                    format!("`{page}`"),
                    backlog.to_string(),
                    samples.to_string(),
                    format!("{:.1}", q(0.5)),
                    format!("{:.1}", q(0.95)),
                ]);
            }
        }
        self.exec("TRUNCATE lease.job, lease.counter").await?;
        out.tables.push(t);
        Ok(())
    }
}

/// A `pg-lease ui` child process; killed on drop.
struct Ui {
    child: Child,
    /// `127.0.0.1:PORT`.
    addr: String,
}

impl Ui {
    fn start(conn: &str) -> Res<Ui> {
        let binary = cli_binary()?;
        let mut child = Command::new(&binary)
            .args(["--url", conn, "ui", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start {}: {e}", binary.display()))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let addr = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    let url = line.split("serving http://").nth(1);
                    if let Some(url) = url.and_then(|u| u.split_whitespace().next()) {
                        break url.trim_end_matches('/').to_owned();
                    }
                }
                _ => return Err("pg-lease ui ended before serving".to_owned()),
            }
        };
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Ok(Ui { child, addr })
    }

    /// One GET of `path`: the server time its answer reports, in ms.
    fn server_ms(&self, path: &str) -> Res<f64> {
        let mut s = TcpStream::connect(&self.addr).map_err(|e| format!("connect: {e}"))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| format!("send: {e}"))?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)
            .map_err(|e| format!("read: {e}"))?;
        if !answer.starts_with("HTTP/1.1 200") {
            let head = answer.lines().next().unwrap_or("");
            return Err(format!("GET {path}: {head}"));
        }
        answer
            .lines()
            .find_map(|l| l.strip_prefix("server-timing: app;dur="))
            .and_then(|ms| ms.trim().parse().ok())
            .ok_or_else(|| format!("GET {path}: no Server-Timing"))
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `pg-lease`, as `bin/bench` builds it (release), else a debug build.
fn cli_binary() -> Res<PathBuf> {
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target");
    ["release", "debug"]
        .iter()
        .map(|profile| target.join(profile).join("pg-lease"))
        .find(|p| p.exists())
        .ok_or_else(|| "no pg-lease binary: cargo build --release -p pg_lease_cli".to_owned())
}
