"""Runs the field harness (bench_harness) with pg_lease's adapter registered
beside its own, and its adapters that run in containers upstream launched
natively: on this machine there is no container runtime (the `docker` beside
this file stands in for the harness's PostgreSQL lifecycle only).

  python run.py HARNESS_DIR [harness arguments]

Registers, without changing a file of the harness:
  pg_lease       benches/field/adapter.json, the `field-adapter` at $FIELD_ADAPTER
  procrastinate  its own main.py, by this Python (PyPI's procrastinate)
  pgboss         its own main.js, by this machine's node (npm's pg-boss)
awa is the harness's own native entry, built against the shared awa source.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def main() -> int:
    harness = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(harness))
    from bench_harness import adapters, versions
    from bench_harness.orchestrator import main as harness_main

    def prebuilt(_skip: bool) -> None:
        # bin/field-bench builds every native adapter before the run.
        return None

    def native(argv: list[str], cwd: Path | None = None):
        def launch(manifest, overrides):
            return adapters.LaunchSpec(
                argv=argv,
                env=adapters._base_env(manifest, overrides),
                cwd=str(cwd) if cwd else None,
            )

        return launch

    adapters.ADAPTERS["pg_lease"] = adapters.AdapterEntry(
        bench_dir=HERE,
        builder=prebuilt,
        launcher=native([os.environ["FIELD_ADAPTER"]]),
    )
    adapters.ADAPTERS["procrastinate"] = adapters.AdapterEntry(
        bench_dir=harness / "procrastinate-bench",
        builder=prebuilt,
        launcher=native([sys.executable, "main.py"], harness / "procrastinate-bench"),
    )
    adapters.ADAPTERS["pgboss"] = adapters.AdapterEntry(
        bench_dir=harness / "pgboss-bench",
        builder=prebuilt,
        launcher=native(["node", "main.js"], harness / "pgboss-bench"),
    )

    def pg_lease_revision() -> dict:
        def git(*args: str) -> str:
            out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
            return out.stdout.strip()

        return {
            "source": "pg_lease checkout",
            "git_short": git("rev-parse", "--short", "HEAD"),
            "git_branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }

    versions._CAPTURE["pg_lease"] = pg_lease_revision
    sys.argv = ["bench", *sys.argv[2:]]
    return harness_main()


if __name__ == "__main__":
    raise SystemExit(main())
