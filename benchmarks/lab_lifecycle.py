"""How fast the lab's lifecycle is, against the issue's targets, in one run (needs root).

    .venv/bin/python benchmarks/lab_lifecycle.py            # cached image
    .venv/bin/python benchmarks/lab_lifecycle.py --cold     # also the first image build, in a scratch cache
    .venv/bin/python benchmarks/lab_lifecycle.py --rounds 20  # the stress test: the cycle 20 times in a row

Uses its own lab instance ("dtlabbench"), so a user's lab is never touched; it is wiped at the end.
Prints each step's min/median/max over the rounds and the median's ratio to the target (<= 1.0 meets
it). With --rounds N the whole cycle (new nodes up, no-op up, restart a node, down, up on existing
nodes, down --wipe) runs N times; it goes on after a failed round and counts it, with its one line.
Exit status 1 when a round failed, a target was missed or anything was left after down.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH_LAB_NAME = "dtlabbench"
# Targets from the issue (seconds); steps without a target are printed for reference.
TARGETS_S = {"image build (cold)": 300.0, "up (cached image, new nodes)": 10.0, "down": 5.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="also time the first image build (minutes)")
    parser.add_argument("--nodes", type=int, default=None, help="node count (default: lab_node_count)")
    parser.add_argument("--rounds", type=int, default=1, help="cycles in a row (the stress test: 20)")
    arguments = parser.parse_args()
    if arguments.rounds < 1:
        parser.error(f"--rounds {arguments.rounds}: needs at least 1")
    scratch_cache = None
    if arguments.cold:
        # Before dtlab.lab is imported: the image cache location is read once, at import.
        scratch_cache = Path(tempfile.mkdtemp(prefix="dtlab-bench-images-", dir="/var/tmp"))
        os.environ["DTLAB_IMAGE_CACHE"] = str(scratch_cache)

    import dtlab.lab
    from dtlab.errors import DtlabError
    from dtlab.lab import config as lab_config
    from dtlab.lab import image

    timings: dict[str, list[float]] = {}
    failures: list[str] = []

    def timed(step: str, function, *args, **kwargs):
        started = time.monotonic()
        result = function(*args, **kwargs)
        timings.setdefault(step, []).append(time.monotonic() - started)
        return result

    config = lab_config.load_config(BENCH_LAB_NAME, node_count=arguments.nodes)
    try:
        dtlab.lab.down(BENCH_LAB_NAME, wipe=True)
        if arguments.cold:
            timed("image build (cold)", image.ensure_image, config)
        for round_number in range(1, arguments.rounds + 1):
            try:
                timed("up (cached image, new nodes)", dtlab.lab.up, BENCH_LAB_NAME,
                      node_count=arguments.nodes)
                timed("up again (no-op)", dtlab.lab.up, BENCH_LAB_NAME)
                timed("restart-node node1", dtlab.lab.restart_node, "node1", BENCH_LAB_NAME)
                timed("down", dtlab.lab.down, BENCH_LAB_NAME)
                timed("up (existing nodes)", dtlab.lab.up, BENCH_LAB_NAME)
                timed("down --wipe", dtlab.lab.down, BENCH_LAB_NAME, wipe=True)
            except DtlabError as error:
                failures.append(f"round {round_number}: {error}")
                print(f"round {round_number} FAILED: {error}", flush=True)
                dtlab.lab.down(BENCH_LAB_NAME, wipe=True)
            leftovers = dtlab.lab.leftovers(BENCH_LAB_NAME)
            if leftovers:
                failures.append(f"round {round_number}: left after down --wipe: {leftovers}")
            if arguments.rounds > 1:
                print(f"round {round_number}/{arguments.rounds} done", flush=True)
    finally:
        dtlab.lab.down(BENCH_LAB_NAME, wipe=True)
        if scratch_cache:
            from dtlab.lab import mounts

            mounts.remove_tree(scratch_cache)
    leftovers = dtlab.lab.leftovers(BENCH_LAB_NAME)

    print(f"\nlab lifecycle, {config.node_count} nodes, {os.cpu_count()} cores, {arguments.rounds} round(s),"
          f" load average at the end {os.getloadavg()[0]:.2f}")
    print(f"{'step':32} {'n':>3} {'min':>7} {'median':>7} {'max':>7} {'target':>7} {'ratio':>6}")
    for step, seconds in timings.items():
        target = TARGETS_S.get(step)
        median = statistics.median(seconds)
        ratio = f"{median / target:6.2f}" if target else "     -"
        print(f"{step:32} {len(seconds):3d} {min(seconds):7.2f} {median:7.2f} {max(seconds):7.2f}"
              f" {target or '-':>7} {ratio}")
    print(f"failed rounds: {len(failures)} of {arguments.rounds}")
    for failure in failures:
        print(f"  {failure}")
    print(f"leftovers after the last down: {leftovers or 'none'}")
    missed = [step for step, seconds in timings.items()
              if step in TARGETS_S and statistics.median(seconds) > TARGETS_S[step]]
    return 1 if missed or leftovers or failures else 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("benchmarks/lab_lifecycle.py: needs root (the lab does)")
    sys.exit(main())
