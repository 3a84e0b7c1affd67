"""Spark's two setups on the lab's three nodes, side by side in one run: each spark cell its own standalone
application (spark_session: application, the default and the study's setup) against a session on the
master's Spark Connect server (spark_session: connect), through the whole harness (bench.all).

    sudo .venv/bin/python benchmarks/spark_session_lab.py [--rounds 3] [--cells 2] [--inventory PATH]

Needs the lab up and converged (`invoke lab.up`, `invoke cluster.provision`, `invoke trainer.deploy`).
Each round converges the spark role for one setup (its switch time is printed, not counted), runs the
smoke profile's spark-g2 cell `--cells` times, then does the same for the other setup; the order inside
a round alternates. It prints min/median/max per whole-run phase (the report's phases, from each run's
recorded clock) and the ratio of the medians, and leaves the lab in spark_session: application. Results go
to a temporary store, never to the lab's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dtlab import paths, provision
from dtlab.lab import inventory as lab_inventory
from dtlab.platforms import load_cluster
from dtlab.report.aggregate import WHOLE_RUN_PHASES, whole_run_phases
from dtlab.results import ResultStore

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._trainer_common import spread  # noqa: E402

SETUPS = ("application", "connect")
CELL = "spark-g2"
INVOKE = str(Path(sys.executable).parent / "invoke")


def switch(inventory: Path, setup: str) -> float:
    """Converge the spark role for `setup`; its seconds."""
    converged = provision.converge(inventory, tags=["spark"])
    if not converged.ok:
        raise SystemExit(f"converging spark for {setup} failed: {converged.summary()}")
    return converged.seconds


def run_cell(inventory: Path, results: Path) -> None:
    ran = subprocess.run([INVOKE, "bench.all", "-i", str(inventory), "--profile", "smoke", "--only", CELL,
                          "--force", "--no-report", "--skip-gate"], capture_output=True, text=True,
                         timeout=900, env={**os.environ, "DTLAB_RESULTS_DIR": str(results)})
    if ran.returncode != 0:
        raise SystemExit(f"bench.all {CELL} failed:\n{ran.stdout[-3000:]}\n{ran.stderr[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both setups (default 3)")
    parser.add_argument("--cells", type=int, default=2, help="cells per setup and round (default 2)")
    parser.add_argument("--inventory", type=Path, default=paths.INVENTORY_DIR / "lab.yml",
                        help="the lab's inventory (default inventory/lab.yml)")
    args = parser.parse_args()
    if args.rounds < 1 or args.cells < 1:
        parser.error("--rounds and --cells need at least 1")
    if not args.inventory.is_file():
        parser.error(f"--inventory {args.inventory}: no such file; bring the lab up first (invoke lab.up)")

    load_at_start = os.getloadavg()[0]  # a figure measured on a busy machine is not a figure
    cluster_name = load_cluster(args.inventory).name  # its results folder's name
    inventories = {"application": args.inventory,
                   "connect": lab_inventory.variant(args.inventory, "sparkbench", spark_session="connect")}
    phases: dict[str, dict[str, list[float]]] = {setup: {} for setup in SETUPS}
    switches: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    labels: dict[str, set[str]] = {setup: set() for setup in SETUPS}
    with tempfile.TemporaryDirectory(prefix="dtlab-sparkbench-") as scratch:
        try:
            for round_index in range(args.rounds):
                for setup in SETUPS if round_index % 2 == 0 else SETUPS[::-1]:
                    switches[setup].append(switch(inventories[setup], setup))
                    results = Path(scratch) / f"{setup}-{round_index}"
                    for _ in range(args.cells):
                        run_cell(inventories[setup], results)
                    recorded = ResultStore(results / cluster_name).runs(status="ok")
                    if len(recorded) != args.cells or any(not whole_run_phases(r.result) for r in recorded):
                        raise SystemExit(f"{setup}: {len(recorded)} of {args.cells} cells recorded with "
                                         "their clock")
                    for run in recorded:
                        labels[setup].add(run.result["framework_label"])
                        for phase, seconds in whole_run_phases(run.result):
                            phases[setup].setdefault(phase, []).append(seconds)
                    print(f"round {round_index + 1} {setup}: switch {switches[setup][-1]:.0f} s, "
                          f"end to end so far {spread(phases[setup]['end to end'], '.1f', width=6)}",
                          flush=True)
        finally:
            try:
                switch(args.inventory, "application")  # the lab as it was: no Connect server
            finally:
                inventories["connect"].unlink(missing_ok=True)

    runs = len(phases["connect"]["end to end"])
    print(f"\nspark-g2 (smoke profile) on the lab, {args.rounds} rounds x {args.cells} cells per setup; "
          f"load average before: {load_at_start:.2f}")
    for setup in SETUPS:
        print(f"  {setup}: {', '.join(sorted(labels[setup]))}; switching to it (spark role): "
              f"{spread(switches[setup], '.1f', width=6)} s")
    header = f"phase (s), median [min-max], n={runs}"
    print(f"{header:<44}{'application':>18}{'connect':>18}{'connect/app':>12}")
    for phase, _, _ in WHOLE_RUN_PHASES:
        app, connect = phases["application"].get(phase, []), phases["connect"].get(phase, [])
        if app and connect:
            ratio = statistics.median(connect) / statistics.median(app)
            print(f"{phase:<44}{spread(app, '.1f'):>18}{spread(connect, '.1f'):>18}{ratio:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
