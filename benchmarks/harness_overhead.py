"""Harness overhead per cell: bench's wall time for a cell beyond the trainer's own measured time.

    .venv/bin/python benchmarks/harness_overhead.py [-i inventory/lab.yml] [--profile smoke] [--only ddp]

Runs every selected cell once (forced, so nothing is skipped) through the same code path as
`invoke bench.all`, then prints, per framework and GPU count, side by side:
  cell wall time (bench.run_cell), trainer time (result.json time_total_s: start of training to end
  of the last validation, the study's span), overhead = wall - trainer, and where it goes:
  preflight + prepare (harness SSH round trips), launch-to-training (process start, imports, data,
  rendezvous, JVM/Spark session: the framework's start-up, paid inside the run), record (store).
Then, per framework against ddp's cell of the same GPU count and round (ratios taken per round, printed
as median [min-max]): submit -> first optimizer step, and the steady-state step time (result.json's
steady_step_time_s); with Slurm's time in its queue beside them.
Target (issue 14): a ddp cell's wall time <= 10 s beyond the trainer's span (median).
Results go to the inventory's store, like bench.all.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from dtlab.bench import Bench, BenchOptions
from dtlab.errors import DtlabError
from dtlab.platforms import load_cluster

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._trainer_common import spread  # noqa: E402

DDP_TARGET_S = 10.0
LEGEND = """
wall:       bench.run_cell, from preflight to recorded
training:   the trainer's time_total_s (the study's span: start of training to end of last validation)
wall-train: everything beyond that span
ssh+rec:    preflight, prepare, result fetch, record (controller side, over SSH)
launch:     units started -> rank 0's trainer process created (systemd-run, then torchrun /
            Spark session, executor and Python worker / the Determined launcher)
setup:      trainer process created -> training started (imports, data, tokenizer, model, rendezvous)
after:      end of training -> every unit ended (result write, process and unit exit)
harness:    wall minus the trainer process's lifetime = ssh+rec + launch (the target's measure)
queued:     Slurm only: sbatch's job id -> the job leaving PENDING (inside launch)"""


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
        result, phases, marks = outcome.result, outcome.phases, outcome.marks
        timeline = result.get("timeline_unix") or {}
        training_s = float(result["time_total_s"])
        # Node and controller clocks agree on the lab (one kernel) and within NTP error on a cluster.
        process_s = marks["units_ended"] - timeline["process_started"]
        rows[(outcome.cell.framework, outcome.cell.gpus)].append(
            {
                "wall": outcome.seconds,
                "training": training_s,
                "beyond_training": outcome.seconds - training_s,
                "ssh": phases.get("preflight", 0)
                + phases.get("prepare", 0)
                + phases.get("record", 0)
                + max(0.0, phases.get("run_and_fetch", 0) - (marks["units_ended"] - marks["units_started"])),
                "to_process": timeline["process_started"] - marks["units_started"],
                "setup": timeline["training_started"] - timeline["process_started"],
                "after": process_s
                - (timeline["training_started"] - timeline["process_started"])
                - training_s,
                "harness": outcome.seconds - process_s,
                "first_step": timeline["first_step_done"] - result["harness_timeline_unix"]["submitted"],
                "steady_step": result.get("steady_step_time_s"),
                "queued": (marks.get("queue_left", 0) - marks.get("queue_entered", 0)) or None,
            }
        )
    rounds = max(1, args.repeat)
    print(
        f"\nharness overhead per cell on {cluster.name} ({cluster.device}, {len(cluster.workers)} workers), "
        f"profile {args.profile}; {rounds} round(s) per row; seconds as median [min-max]"
    )
    columns = [
        ("wall", "wall"),
        ("training", "training"),
        ("beyond_training", "wall-train"),
        ("ssh", "ssh+rec"),
        ("to_process", "launch"),
        ("setup", "setup"),
        ("after", "after"),
        ("harness", "harness"),
    ]
    width = 18
    header = f"{'framework':<11}{'gpus':>5}" + "".join(f"{title:>{width}}" for _, title in columns)
    print(header)
    print("-" * len(header))
    verdict = []
    for (framework, gpus), samples in sorted(rows.items()):
        cells = [spread([sample[key] for sample in samples], '.1f') for key, _ in columns]
        print(f"{framework:<11}{gpus:>5}" + "".join(f"{cell:>{width}}" for cell in cells))
        if framework == "ddp":
            verdict.append(statistics.median(s["beyond_training"] for s in samples) <= DDP_TARGET_S)
    print(LEGEND)
    print_ratios_against_ddp(rows)
    if verdict:
        print(
            f"\nddp target: median wall - training <= {DDP_TARGET_S:.0f} s: "
            f"{'met' if all(verdict) else 'MISSED'}"
        )
    return 0


def print_ratios_against_ddp(rows: dict) -> None:
    """Submit -> first step and steady step per framework over ddp's, round by round (the i-th run of each
    cell is round i: cells of one round ran back to back)."""
    print("\nagainst ddp, per round: median [min-max]")
    print(f"{'framework':<11}{'gpus':>5}{'submit->first step (s)':>26}{'x ddp':>24}{'steady step x ddp':>26}"
          f"{'queued (s)':>22}")
    for (framework, gpus), samples in sorted(rows.items()):
        ddp = rows.get(("ddp", gpus))
        if not ddp:
            continue
        rounds = list(zip(samples, ddp, strict=False))
        first = [run["first_step"] / base["first_step"] for run, base in rounds]
        steady = [run["steady_step"] / base["steady_step"] for run, base in rounds
                  if run["steady_step"] and base["steady_step"]]
        queued = [run["queued"] for run in samples if run["queued"] is not None]
        print(f"{framework:<11}{gpus:>5}{spread([s['first_step'] for s in samples], '.1f'):>26}"
              f"{spread(first, '.2f', 'x'):>24}{spread(steady, '.3f', 'x') if steady else '-':>26}"
              f"{spread(queued, '.2f') if queued else '-':>22}")


if __name__ == "__main__":
    sys.exit(main())
