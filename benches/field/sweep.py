"""Drives the field harness through the cells of its own published sweep
(scripts/run_full_sweep.sh: throughput, chaos, pressure) plus a fixed-rate
latency cell, one `bench run` per cell as the sweep does, and collects the
harness's own outputs and a summary table under OUT.

  python sweep.py HARNESS_DIR OUT [--systems a,b] [--cells c,d] [--fast]
                  [--widths 64,256] [--latency-rate N] [--chaos a,b]
                  [--pressure a,b] [--append] [--tag SUFFIX]

Cells (in this order): throughput (depth-target 4000, one run per width),
latency (fixed rate at half awa's peak, or --latency-rate), chaos (the five
chaos scenarios: 600 jobs/s on one replica, or 300 on each of two),
pressure (idle-in-transaction, sustained high load, active readers, burst).
Every system in a cell runs on a fresh cluster of the same PostgreSQL.
--fast shortens every phase (a smoke run, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

THROUGHPUT_PHASES = ["warmup=warmup:30s", "clean=clean:120s"]
LATENCY_PHASES = ["warmup=warmup:30s", "clean=clean:120s"]
# The harness's named chaos scenarios, with the sweep's rate and replicas.
CHAOS = {
    "chaos_postgres_restart": (600, 1),
    "chaos_pg_backend_kill": (600, 1),
    "chaos_pool_exhaustion": (600, 1),
    "chaos_crash_recovery": (300, 2),
    "chaos_repeated_kills": (300, 2),
}
# The sweep's pressure cells: phases, rate, workers.
PRESSURE = {
    "idle_in_tx": ("idle_1=idle-in-tx:240s", "recovery_1=clean:180s", 800, 32),
    "sustained_high_load": ("pressure_1=high-load:240s", "recovery_1=clean:120s", 800, 32),
    "active_readers": ("readers_1=active-readers:240s", "recovery_1=clean:120s", 800, 32),
    "event_burst": ("pressure_1=high-load:300s", "recovery_1=clean:240s", 1200, 64),
}
PRESSURE_LEAD = ["warmup=warmup:30s", "clean_1=clean:60s"]
# Upstream's sweep kills a pressure cell after 15 minutes: it did not complete.
PRESSURE_TIMEOUT_S = 15 * 60


def shorten(spec: str, fast: bool) -> str:
    """A phase spec with its duration cut to 10-20 s under --fast."""
    if not fast:
        return spec
    label_type, _, _dur = spec.rpartition(":")
    return f"{label_type}:{10 if 'warmup' in label_type else 20}s"


def fast_chaos_phases(scenario: str) -> list[str]:
    """The scenario's own phase list (bench_harness.phases), shortened."""
    from bench_harness.phases import SCENARIOS

    out = []
    for spec in SCENARIOS[scenario]:
        spec = re.sub(r"period=\d+s", "period=8s", spec)
        out.append(shorten(spec, True))
    return out


class Sweep:
    def __init__(self, harness: Path, out: Path, fast: bool, tag: str) -> None:
        self.tag = tag
        self.harness = harness
        self.out = out
        self.fast = fast
        self.rows: list[dict] = []
        (out / "logs").mkdir(parents=True, exist_ok=True)
        (out / "runs").mkdir(parents=True, exist_ok=True)

    def run(self, cell: str, systems: list[str], args: list[str], timeout: int | None = None) -> dict | None:
        """One `bench run`; returns its summary.json (None if it failed)."""
        cell += self.tag
        log = self.out / "logs" / f"{cell}.log"
        argv = [sys.executable, str(HERE / "run.py"), str(self.harness), "run",
                "--systems", ",".join(systems), *args]
        print(f"[field-bench] {cell}: {' '.join(argv[3:])}", flush=True)
        started = time.time()
        with log.open("w") as fh:
            try:
                proc = subprocess.run(argv, cwd=self.harness, stdout=fh, stderr=subprocess.STDOUT,
                                      timeout=timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
                # The harness's adapters and cluster outlive a killed driver.
                subprocess.run(["pkill", "-f", "field-adapter|awa-bench|procrastinate-bench|pgboss-bench/main.js"])
                subprocess.run(["docker", "compose", "down", "-v"], cwd=self.harness)
        took = time.time() - started
        text = log.read_text(errors="replace")
        # A run that failed part-way leaves the summary of the systems it
        # finished (the harness writes it after each).
        found = re.findall(r"run_id = (\S+)", text)
        print(f"[field-bench] {cell}: rc={rc} in {took:.0f}s", flush=True)
        self.record_checks(cell)
        run_dir = self.harness / "results" / found[-1] if found else None
        if run_dir is None or not (run_dir / "summary.json").exists():
            self.rows.append({"cell": cell, "systems": systems, "rc": rc, "summary": None})
            return None
        keep = self.out / "runs" / cell
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir(parents=True)
        for name in ("summary.json", "manifest.json", "README.md"):
            if (run_dir / name).exists():
                shutil.copy(run_dir / name, keep / name)
        for png in ("throughput", "claim_p99", "dead_tuples"):
            src = run_dir / "plots" / f"{png}.png"
            if src.exists():
                shutil.copy(src, keep / f"{png}.png")
        summary = json.loads((run_dir / "summary.json").read_text())
        self.rows.append({"cell": cell, "systems": systems, "rc": rc, "summary": summary})
        return summary

    def record_checks(self, cell: str) -> None:
        """Moves the stand-in's account of pg_lease's queue (check.sql) to OUT."""
        checks = self.out / "checks-pending"
        for i, f in enumerate(sorted(checks.glob("*.json")) if checks.exists() else []):
            f.rename(self.out / "runs" / f"{cell}.pg_lease-check-{i}.json")


def clean_metric(summary: dict | None, system: str, metric: str, phase: str = "clean") -> float | None:
    try:
        return summary["systems"][system]["phases"][phase]["metrics"][metric]["median"]
    except (KeyError, TypeError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("harness", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--systems", default="pg_lease,awa")
    ap.add_argument("--cells", default="throughput,latency,chaos,pressure")
    ap.add_argument("--widths", default="64,256")
    ap.add_argument("--latency-rate", type=int, default=0)
    ap.add_argument("--chaos", default=",".join(CHAOS), help="chaos scenarios to run")
    ap.add_argument("--pressure", default=",".join(PRESSURE), help="pressure cells to run")
    ap.add_argument("--append", action="store_true", help="add to OUT's earlier cells")
    ap.add_argument("--tag", default="", help="suffix of this run's cell names (a rerun beside earlier ones)")
    ap.add_argument("--fast", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(a.harness.resolve()))
    systems = a.systems.split(",")
    cells = a.cells.split(",")
    sweep = Sweep(a.harness.resolve(), a.out.resolve(), a.fast, a.tag)
    fast = ["--fast"] if a.fast else []
    phases = lambda specs: [x for s in specs for x in ("--phase", shorten(s, a.fast))]  # noqa: E731

    peaks: dict[str, tuple[float, int]] = {}
    earlier: list[dict] = []
    if a.append and (sweep.out / "sweep.json").exists():
        before = json.loads((sweep.out / "sweep.json").read_text())
        peaks = {k: tuple(v) for k, v in before["peaks"].items()}
        earlier = before["cells"]
    if "throughput" in cells:
        for w in [int(x) for x in a.widths.split(",")]:
            s = sweep.run(f"throughput_w{w}", systems,
                          ["--producer-mode", "depth-target", "--target-depth", "4000",
                           "--producer-rate", "50000", "--worker-count", str(w),
                           *phases(THROUGHPUT_PHASES), *fast])
            for system in systems:
                rate = clean_metric(s, system, "completion_rate")
                if rate is not None and rate > peaks.get(system, (0.0, 0))[0]:
                    peaks[system] = (rate, w)
    if "latency" in cells:
        base = peaks.get("awa") or peaks.get(systems[0])
        rate = a.latency_rate or (int(base[0] / 2) if base else 800)
        width = base[1] if base else 32
        sweep.run("latency_fixed", [s for s in systems if s in ("pg_lease", "awa")] or systems,
                  ["--producer-rate", str(rate), "--worker-count", str(width),
                   *phases(LATENCY_PHASES), *fast])
    if "chaos" in cells:
        for scenario in a.chaos.split(","):
            rate, replicas = CHAOS[scenario]
            shape = (["--scenario", scenario] if not a.fast
                     else [x for s in fast_chaos_phases(scenario) for x in ("--phase", s)])
            sweep.run(scenario, systems,
                      [*shape, "--producer-rate", str(rate), "--replicas", str(replicas), *fast])
    if "pressure" in cells:
        for name in a.pressure.split(","):
            stress, recovery, rate, workers = PRESSURE[name]
            for system in systems:
                sweep.run(f"{name}_{system}", [system],
                          ["--producer-rate", str(rate), "--worker-count", str(workers),
                           *phases([*PRESSURE_LEAD, stress, recovery]), *fast],
                          timeout=PRESSURE_TIMEOUT_S)
    (sweep.out / "sweep.json").write_text(json.dumps(
        {"peaks": peaks,
         "cells": earlier + [{k: v for k, v in r.items() if k != "summary"} for r in sweep.rows]},
        indent=2) + "\n")
    failed = [r["cell"] for r in sweep.rows if r["rc"] != 0]
    print(f"[field-bench] done; cells that did not finish: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
