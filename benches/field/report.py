"""Writes OUT/RESULTS.md from what sweep.py kept: per cell and system, the
harness's own medians (completion rate, claim p99), its chaos aggregates
(jobs_lost, chaos_recovery_time_s) and peak dead tuples of the declared
event tables, plus the stand-in's account of pg_lease's queue.

  python report.py OUT [--check]

--check (the smoke run in CI) fails unless pg_lease completed jobs in every
cell and the stand-in's account of its queue found none lost.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STRESS_PHASES = ("idle_1", "pressure_1", "readers_1", "kills", "exhaustion", "restart", "kill", "repeated")


def fmt(v, digits=0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def median(phase: dict | None, metric: str):
    try:
        return phase["metrics"][metric]["median"]
    except (KeyError, TypeError):
        return None


def dead_tuples_peak(phases: dict) -> float | None:
    """Peak over the run of the sum of n_dead_tup over event tables, taking
    each table's peak per phase (an upper bound of the summed peak)."""
    best = None
    for phase in phases.values():
        total = sum(m["peak"] for k, m in phase.get("metrics", {}).items()
                    if k.startswith("n_dead_tup@"))
        best = total if best is None else max(best, total)
    return best


def find(d, key):
    """First value of `key` anywhere in nested dicts."""
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for v in d.values():
            r = find(v, key)
            if r is not None:
                return r
    return None


def main() -> int:
    out = Path(sys.argv[1])
    sweep = json.loads((out / "sweep.json").read_text())
    lines = ["# The field's benchmark: results", "",
             "Written by `benches/field/report.py` from the harness's own `summary.json` of each cell",
             "(`runs/<cell>/`). Rates are medians of the 5 s samples of the phase; `claim p99` is",
             "the median of the rolling-30 s p99 pickup latency (insert to handler start).", "",
             "| cell | system | rc | completion/s (clean) | claim p99 ms (clean) | stress phase: completion/s | jobs_lost | recovery s | dead tuples peak |",
             "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for cell in sweep["cells"]:
        path = out / "runs" / cell["cell"] / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        for system in cell["systems"]:
            phases = summary.get("systems", {}).get(system, {}).get("phases", {})
            clean = phases.get("clean") or phases.get("baseline") or phases.get("clean_1")
            stress = next((phases[p] for p in STRESS_PHASES if p in phases), None)
            lines.append("| " + " | ".join([
                cell["cell"], system, str(cell["rc"]),
                fmt(median(clean, "completion_rate")),
                fmt(median(clean, "claim_p99_ms"), 1),
                fmt(median(stress, "completion_rate")),
                fmt(find(phases, "jobs_lost")),
                fmt(find(phases, "chaos_recovery_time_s"), 1),
                fmt(dead_tuples_peak(phases)),
            ]) + " |")
    checks = sorted((out / "runs").glob("*.pg_lease-check-*.json"))
    if checks:
        lines += ["", "## pg_lease's queue after each run (benches/field/check.sql)", "",
                  "`unaccounted` = enqueued − done − rows left: 0 means no job was lost.", "",
                  "| run | enqueued | done | left | unaccounted | claims | recovered by reaper |",
                  "|---|--:|--:|--:|--:|--:|--:|"]
        for f in checks:
            c = json.loads(f.read_text())
            lines.append(f"| {f.stem} | {c['enqueued_total']:,} | {c['done_total']:,} | {c['rows_left']:,} "
                         f"| {c['unaccounted']} | {c['claimed_total']:,} | {c['recovered_total']:,} |")
    peaks = sweep.get("peaks", {})
    if peaks:
        lines += ["", "Peak clean throughput over the widths run: " + ", ".join(
            f"{s} {r:,.0f}/s at {w} workers" for s, (r, w) in peaks.items())]
    (out / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print((out / "RESULTS.md").read_text())
    if "--check" in sys.argv:
        return check(out, sweep)
    return 0


def check(out: Path, sweep: dict) -> int:
    problems = []
    for cell in sweep["cells"]:
        path = out / "runs" / cell["cell"] / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        phases = summary.get("systems", {}).get("pg_lease", {}).get("phases", {})
        rates = [median(p, "completion_rate") or 0 for p in phases.values()]
        if "pg_lease" in cell["systems"] and not any(r > 0 for r in rates):
            problems.append(f"{cell['cell']}: pg_lease completed nothing")
    checks = sorted((out / "runs").glob("*.pg_lease-check-*.json"))
    if not checks:
        problems.append("no account of pg_lease's queue was recorded")
    for f in checks:
        c = json.loads(f.read_text())
        if c["unaccounted"] != 0 or c["dead_total"] != 0:
            problems.append(f"{f.stem}: {c}")
    for p in problems:
        print(f"field-bench check: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
