//! `bench`: pg_lease's benchmark runner.
//!
//! Starts a throwaway PostgreSQL 15 cluster with fixed settings (see
//! `pg_lease_benches::SETTINGS`), creates the extension and the hand-written baseline's
//! tables, then measures side by side: pgbench drains (pg_lease vs the
//! hand-written seed SQL vs a primary-key UPDATE ceiling), the same drains
//! with per-key concurrency, enqueue, renew
//! and its HOT share, the Rust client, its `Worker` (beside the
//! hand-written SQL on the same rows), claim latency vs
//! backlog, the cost of a metrics poll, a pinned xmin, sustained churn, a concurrency sweep,
//! instructions per job counted by callgrind, and drains on Citus (clusters of their own). Prints
//! a Markdown report and writes it, with a plot, to `benches/results/`
//! (`benches/results/smoke/` with `--smoke`).
//!
//! ```text
//! bench [--smoke] [--only SECTION,...] [--churn-seconds N] [--out DIR]
//! bench --plot-from DIR     (redraw DIR's plot from its sweep.json)
//! sections: claim, keys, rate, fairness, enqueue, renew, client, worker, latency, metrics, dashboard, pinned, churn, reaper, sweep,
//!           instructions, citus
//! ```
//!
//! The extension must be installed into the PostgreSQL 15 that
//! `pg_tests::pg_bin_dir()` points at (`bin/bench` does that first).

mod churn;
mod citus;
mod cpu;
mod dashboard;
mod fairness;
mod instructions;
mod keys;
mod metrics;
mod pgbench;
mod rate;
mod reaper;
mod report;
mod scenarios;
mod worker;

use std::path::{Path, PathBuf};
use std::time::Instant;

use pg_lease_benches::{start_cluster, SETTINGS};
use pg_tests::TEST_DB;

use crate::pgbench::Pgbench;
use crate::report::Results;
use crate::scenarios::{connect, Bench, Res, Size};

const SECTIONS: &[&str] = &[
    "claim",
    "keys",
    "rate",
    "fairness",
    "enqueue",
    "renew",
    "client",
    "worker",
    "latency",
    "metrics",
    "dashboard",
    "pinned",
    "churn",
    "reaper",
    "sweep",
    "instructions",
    "citus",
];

struct Args {
    smoke: bool,
    /// `--churn-seconds`: overrides the size's churn length.
    churn_seconds: Option<u64>,
    plot_from: Option<PathBuf>,
    only: Vec<String>,
    out: PathBuf,
}

fn parse_args() -> Res<Args> {
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut smoke = false;
    let mut churn_seconds = None;
    let mut only = Vec::new();
    let mut out = None;
    let mut plot_from = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => smoke = true,
            "--churn-seconds" => {
                let n = args.next().ok_or("--churn-seconds needs a number")?;
                churn_seconds = Some(n.parse().map_err(|e| format!("--churn-seconds {n}: {e}"))?);
            }
            "--only" => {
                let list = args.next().ok_or("--only needs a list of sections")?;
                for s in list.split(',') {
                    if !SECTIONS.contains(&s) {
                        return Err(format!(
                            "unknown section {s} (known: {})",
                            SECTIONS.join(", ")
                        ));
                    }
                    only.push(s.to_owned());
                }
            }
            "--plot-from" => {
                plot_from = Some(PathBuf::from(
                    args.next().ok_or("--plot-from needs a directory")?,
                ))
            }
            "--out" => out = Some(PathBuf::from(args.next().ok_or("--out needs a directory")?)),
            "-h" | "--help" => {
                println!(
                    "bench [--smoke] [--only SECTION,...] [--churn-seconds N] [--out DIR] | bench --plot-from DIR\nsections: {}",
                    SECTIONS.join(", ")
                );
                std::process::exit(0);
            }
            // `cargo bench` passes --bench to every target.
            "--bench" => {}
            other => return Err(format!("unknown argument {other} (try --help)")),
        }
    }
    let out = out.unwrap_or_else(|| {
        let results = bench_dir.join("results");
        if smoke {
            results.join("smoke")
        } else {
            results
        }
    });
    Ok(Args {
        smoke,
        churn_seconds,
        plot_from,
        only,
        out,
    })
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}

const PLOT_TITLE: &str = "Claim + complete at batch 50: throughput vs clients";

fn run() -> Res<()> {
    let args = parse_args()?;
    if let Some(dir) = &args.plot_from {
        // Redraw a run's plot from its sweep.json, without measuring.
        let text = std::fs::read_to_string(dir.join("sweep.json"))
            .map_err(|e| format!("read {}: {e}", dir.join("sweep.json").display()))?;
        let png = dir.join("throughput_vs_clients.png");
        report::plot(&report::sweep_from_json(&text)?, &png, PLOT_TITLE)?;
        eprintln!("bench: wrote {}", png.display());
        return Ok(());
    }
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("create {}: {e}", args.out.display()))?;
    let scratch = std::env::temp_dir().join(format!("pg_lease_bench_{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("create {}: {e}", scratch.display()))?;

    let started = Instant::now();
    eprintln!("bench: starting a throwaway cluster");
    let cluster = start_cluster();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let result = runtime.block_on(async {
        let conn = cluster.conn_string(TEST_DB);
        let admin = connect(&conn).await?;
        Bench::create_tables(&admin, &bench_dir.join("pgbench")).await?;
        let version: String = admin
            .query_one("SHOW server_version", &[])
            .await
            .map_err(|e| e.to_string())?
            .get(0);
        let base = if args.smoke {
            Size::smoke()
        } else {
            Size::full()
        };
        let bench = Bench {
            conn,
            admin,
            pgbench: Pgbench {
                binary: pg_tests::pg_bin_dir().join("pgbench"),
                scripts: bench_dir.join("pgbench"),
                port: cluster.port(),
                db: TEST_DB.to_owned(),
                scratch: scratch.clone(),
            },
            size: Size {
                churn_seconds: args.churn_seconds.unwrap_or(base.churn_seconds),
                ..base
            },
        };
        let mut results = Results {
            setup: setup_lines(&version, &bench.size, args.smoke),
            ..Results::default()
        };
        let wanted = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
        for section in SECTIONS {
            if !wanted(section) {
                continue;
            }
            let t0 = Instant::now();
            eprintln!("bench: {section} ...");
            match *section {
                "claim" => bench.claim_complete(&mut results).await?,
                "keys" => bench.keys(&mut results).await?,
                "rate" => bench.rate(&mut results).await?,
                "fairness" => bench.fairness(&mut results).await?,
                "enqueue" => bench.enqueue(&mut results).await?,
                "renew" => bench.renew(&mut results).await?,
                "client" => bench.client(&mut results).await?,
                "worker" => bench.worker(&mut results).await?,
                "latency" => bench.latency(&mut results).await?,
                "metrics" => bench.metrics(&mut results).await?,
                "dashboard" => bench.dashboard(&mut results).await?,
                "pinned" => bench.pinned(&mut results).await?,
                "churn" => bench.churn(&mut results).await?,
                "reaper" => bench.reaper(&mut results).await?,
                "sweep" => bench.sweep(&mut results).await?,
                "instructions" => bench.instructions(&mut results).await?,
                "citus" => citus::citus(&bench.size, &mut results).await?,
                _ => {}
            }
            eprintln!(
                "bench: {section} done in {:.0} s",
                t0.elapsed().as_secs_f64()
            );
        }
        Ok::<Results, String>(results)
    });
    drop(runtime);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&scratch);
    let mut results = result?;
    results.setup.push(format!(
        "whole run: {:.0} s",
        started.elapsed().as_secs_f64()
    ));

    let md = results.markdown();
    println!("{md}");
    let md_path = args.out.join("results.md");
    std::fs::write(&md_path, &md).map_err(|e| format!("write {}: {e}", md_path.display()))?;
    eprintln!("bench: wrote {}", md_path.display());
    let json_path = args.out.join("sweep.json");
    std::fs::write(&json_path, report::sweep_json(&results.sweep))
        .map_err(|e| format!("write {}: {e}", json_path.display()))?;
    let png = args.out.join("throughput_vs_clients.png");
    match report::plot(&results.sweep, &png, PLOT_TITLE) {
        Ok(()) => eprintln!("bench: wrote {}", png.display()),
        // The numbers matter more than the picture: report and go on.
        Err(e) => eprintln!("bench: no plot: {e}"),
    }
    Ok(())
}

fn setup_lines(version: &str, size: &Size, smoke: bool) -> Vec<String> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    vec![
        format!(
            "mode: {}",
            if smoke {
                "smoke (tiny sizes: checks that everything runs; the numbers mean nothing)"
            } else {
                "full"
            }
        ),
        format!("PostgreSQL {version}, {cores} cores, one throwaway cluster for the whole run (server, pgbench and the Rust client share the machine)"),
        format!("settings: {}", SETTINGS.join(", ")),
        "pgbench: `-M prepared -n`, `-j 2`; owners `bench-<client_id>`; queue `q` with the default policy (retention 0: done rows are deleted)".to_owned(),
        format!(
            "drains: {} rows at batch 50, {} at batch 1, Worker {}; time-based runs {} s; backlogs {:?}; churn {} s; pinned-xmin drains {} rows",
            size.drain_b50, size.drain_b1, size.worker_rows, size.seconds, size.backlogs, size.churn_seconds, size.pinned_rows
        ),
    ]
}
