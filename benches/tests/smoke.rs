//! The benchmark runner's smoke mode works end to end: a throwaway cluster,
//! every scenario on tiny sizes, a report with the targets table. Timings
//! are never asserted (CI machines vary); only that everything ran and the
//! report says what it measured. Needs the extension installed.

use std::process::Command;

#[test]
fn smoke_run_measures_every_scenario() {
    let out_dir = std::env::temp_dir().join(format!("pg_lease_bench_smoke_{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--smoke")
        .arg("--out")
        .arg(&out_dir)
        .output()
        .expect("run the bench binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "bench --smoke failed:\n{stdout}\n{stderr}"
    );
    let report = std::fs::read_to_string(out_dir.join("results.md")).expect("results.md written");
    for heading in [
        "Targets (ratios from this run)",
        "Claim + complete, pgbench, 16 clients",
        "Enqueue, pgbench, 16 clients",
        "Renew, pgbench, 16 clients",
        "Rust client (pg_lease_client)",
        "Claim latency vs backlog",
        "Pinned xmin",
        "Sustained churn",
        "Per-key concurrency",
        "Rate limits",
        "Fairness keys",
        "Reaper cost in idle databases",
        "Dashboard pages vs backlog",
        "Concurrency sweep",
        "Instructions per job (callgrind)",
    ] {
        assert!(
            report.contains(heading),
            "report lacks {heading:?}:\n{report}"
        );
    }
    // Every target got a number: nothing was skipped.
    assert!(
        !report.contains("not measured"),
        "a target was not measured:\n{report}"
    );
    // Every drain drained: no row left behind, no deadline hit.
    assert!(!stderr.contains("rows left after the drain"), "{stderr}");
    assert!(!report.contains("(deadline)"), "{report}");
    let _ = std::fs::remove_dir_all(&out_dir);
}
