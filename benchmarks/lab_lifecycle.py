"""How fast the lab's lifecycle is, against the issue's targets, in one run (needs root).

    .venv/bin/python benchmarks/lab_lifecycle.py            # cached image
    .venv/bin/python benchmarks/lab_lifecycle.py --cold     # also the first image build, in a scratch cache

Uses its own lab instance ("dtlabbench"), so a user's lab is never touched; it is wiped at the end.
Prints each step's time and its ratio to the target (ratio <= 1.0 meets the target).
"""

from __future__ import annotations

import argparse
import os
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
    arguments = parser.parse_args()
    scratch_cache = None
    if arguments.cold:
        # Before dtlab.lab is imported: the image cache location is read once, at import.
        scratch_cache = Path(tempfile.mkdtemp(prefix="dtlab-bench-images-", dir="/var/tmp"))
        os.environ["DTLAB_IMAGE_CACHE"] = str(scratch_cache)

    import dtlab.lab
    from dtlab.lab import config as lab_config
    from dtlab.lab import image

    timings: list[tuple[str, float]] = []

    def timed(step: str, function, *args, **kwargs):
        started = time.monotonic()
        result = function(*args, **kwargs)
        timings.append((step, time.monotonic() - started))
        return result

    config = lab_config.load_config(BENCH_LAB_NAME, node_count=arguments.nodes)
    try:
        dtlab.lab.down(BENCH_LAB_NAME, wipe=True)
        if arguments.cold:
            timed("image build (cold)", image.ensure_image, config)
        timed("up (cached image, new nodes)", dtlab.lab.up, BENCH_LAB_NAME, node_count=arguments.nodes)
        timed("up again (no-op)", dtlab.lab.up, BENCH_LAB_NAME)
        timed("restart-node node1", dtlab.lab.restart_node, "node1", BENCH_LAB_NAME)
        timed("down", dtlab.lab.down, BENCH_LAB_NAME)
        timed("up (existing nodes)", dtlab.lab.up, BENCH_LAB_NAME)
        timed("down --wipe", dtlab.lab.down, BENCH_LAB_NAME, wipe=True)
    finally:
        dtlab.lab.down(BENCH_LAB_NAME, wipe=True)
        if scratch_cache:
            from dtlab.lab import mounts

            mounts.remove_tree(scratch_cache)
    leftovers = dtlab.lab.leftovers(BENCH_LAB_NAME)

    print(f"\nlab lifecycle, {config.node_count} nodes, {os.cpu_count()} cores")
    print(f"{'step':32} {'seconds':>8} {'target':>8} {'ratio':>6}")
    for step, seconds in timings:
        target = TARGETS_S.get(step)
        ratio = f"{seconds / target:6.2f}" if target else "     -"
        print(f"{step:32} {seconds:8.2f} {target or '-':>8} {ratio}")
    print(f"leftovers after down: {leftovers or 'none'}")
    missed = [step for step, seconds in timings if step in TARGETS_S and seconds > TARGETS_S[step]]
    return 1 if missed or leftovers else 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("benchmarks/lab_lifecycle.py: needs root (the lab does)")
    sys.exit(main())
