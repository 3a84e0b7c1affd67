"""Harness overhead per cell: bench's wall time for a cell beyond the trainer's own measured time.

    .venv/bin/python benchmarks/harness_overhead.py [-i inventory/lab.yml] [--profile smoke] [--only ddp]

Runs every selected cell once (forced, so nothing is skipped) through the same code path as
`invoke bench.all`, then prints, per framework and GPU count, side by side:
  cell wall time (bench.run_cell), trainer time (result.json time_total_s: start of training to end
  of the last validation, the study's span), overhead = wall - trainer, and where it goes:
  preflight + prepare (harness SSH round trips), launch-to-training (process start, imports, data,
  rendezvous, JVM/Spark session: the framework's start-up, paid inside the run), record (store).
Target (issue 6): ddp overhead <= 10 s per cell. Results go to the inventory's store, like bench.all.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

from dtlab.bench import Bench, BenchOptions
from dtlab.errors import DtlabError
from dtlab.inventory import load_cluster

DDP_TARGET_S = 10.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", help="inventory (default: ansible.cfg's)")
    parser.add_argument("--profile", default="smoke", help="matrix profile (default smoke)")
    parser.add_argument("--only", help="cell filter as in bench.all --only")
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the selected cells this many times (means)"
    )
    args = parser.parse_args(argv)
    try:
        cluster = load_cluster(args.inventory)
        bench = Bench(
            cluster, BenchOptions(profile=args.profile, only=args.only, force=True, retries=0, report=False)
        )
        selected = bench.load_matrix()
        outcomes = []
        for _ in range(max(1, args.repeat)):
            bench.display = None  # a fresh progress display per pass
            outcomes += bench.run_matrix(selected)
    except DtlabError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows = defaultdict(list)
    for outcome in outcomes:
        if outcome.status != "ok" or not outcome.result:
            print(
                f"{outcome.cell.key}: {outcome.status} ({outcome.failure.reason if outcome.failure else ''})"
            )
            continue
        trainer_s = float(outcome.result["time_total_s"])
        phases = outcome.phases
        rows[(outcome.cell.framework, outcome.cell.gpus)].append(
            {
                "wall": outcome.seconds,
                "trainer": trainer_s,
                "overhead": outcome.seconds - trainer_s,
                "ssh": phases.get("preflight", 0) + phases.get("prepare", 0),
                "startup": phases.get("run_and_fetch", 0) - trainer_s,
                "record": phases.get("record", 0),
            }
        )
    print(
        f"\nharness overhead per cell on {cluster.name} ({cluster.device}, {len(cluster.workers)} workers), "
        f"profile {args.profile}"
    )
    print(f"(means of {max(1, args.repeat)} run(s) per row; wall = bench.run_cell, preflight to record)")
    header = (
        f"{'framework':<11}{'gpus':>5}{'wall s':>9}{'trainer s':>11}{'overhead s':>12}{'wall/trainer':>14}"
        f"{'ssh+prep s':>12}{'start-up s':>12}{'record s':>10}"
    )
    print(header)
    print("-" * len(header))
    verdict = []
    for (framework, gpus), samples in sorted(rows.items()):
        mean = {k: statistics.mean(s[k] for s in samples) for k in samples[0]}
        print(
            f"{framework:<11}{gpus:>5}{mean['wall']:>9.1f}{mean['trainer']:>11.1f}{mean['overhead']:>12.1f}"
            f"{mean['wall'] / mean['trainer']:>13.2f}x{mean['ssh']:>12.1f}{mean['startup']:>12.1f}"
            f"{mean['record']:>10.2f}"
        )
        if framework == "ddp":
            verdict.append(mean["overhead"] <= DDP_TARGET_S)
    if verdict:
        print(f"\nddp target overhead <= {DDP_TARGET_S:.0f} s: {'met' if all(verdict) else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
