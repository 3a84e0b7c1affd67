"""A trainer process's start-up with and without the bytecode cache, side by side (issue #50: setup.sh's venv
is installed with pip's --no-compile, so where PYTHONDONTWRITEBYTECODE=1 is set, every process compiled
every module it imported again). Each run is a fresh child that imports what a trainer process imports
(the trainer role's trainer_core_imports, and the torchrun launcher) and exits; its wall time and CPU
seconds (wait4) are taken, min/median/max over rounds.

    .venv/bin/python benchmarks/bytecode_cache.py [--rounds 5]

Both children read their bytecode from a PYTHONPYCACHEPREFIX that a first, untimed run filled. "cached" reads
all of it; "compiled each time" reads only the standard library's part (as the machine's Python has it) and
writes nothing, so it compiles every module of the venv and the repository it imports, as every process did
before setup.sh's dtlab-write-bytecode.pth. The two take turns, the first one alternating by round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._trainer_common import machine, spread  # noqa: E402

# What a trainer process imports before its first step (roles/trainer/defaults/main.yml's core imports).
IMPORTS = ("torch, transformers, transformers.models.bert.modeling_bert, tokenizers, datasets, yaml, "
           "jsonschema, psutil, trainer.launchers.torchrun")


def measure(cache_dir: Path, write: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child importing IMPORTS with cache_dir as its bytecode cache."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(cache_dir), "PYTHONPATH": str(REPO)}
    # Set in the program, after site ran the venv's .pth (which turns writing on).
    command = [sys.executable, "-c", f"import sys; sys.dont_write_bytecode = {not write}; import {IMPORTS}"]
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=REPO)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the child ({' '.join(command[:2])}) failed")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"bytecode_cache: {args.rounds} rounds; {machine()}")
    with tempfile.TemporaryDirectory(prefix="bytecode-") as scratch:
        stdlib_only, filled = Path(scratch) / "stdlib", Path(scratch) / "filled"
        measure(filled, write=True)
        stdlib = Path(sys.base_prefix).resolve() / "lib"  # the prefix mirrors each source's absolute path
        shutil.copytree(filled / stdlib.relative_to("/"), stdlib_only / stdlib.relative_to("/"))
        files = sum(1 for _ in stdlib_only.rglob("*.pyc"))
        runs = {"compiled each time": (stdlib_only, False), "cached": (filled, False)}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for round_number in range(args.rounds):
            order = list(runs) if round_number % 2 == 0 else list(reversed(runs))
            for name in order:
                results[name].append(measure(*runs[name]))
                wall, cpu = results[name][-1]
                print(f"  round {round_number + 1} {name:18s} {wall:5.2f} s wall, {cpu:5.2f} s CPU")
        if sum(1 for _ in stdlib_only.rglob("*.pyc")) != files:
            raise SystemExit("the uncached runs wrote a cache: they were not compiling each time")
    for name in runs:
        print(f"{name:18s} wall {spread([r[0] for r in results[name]], unit=' s', width=6)}, "
              f"CPU {spread([r[1] for r in results[name]], unit=' s', width=6)}")
    ratios = [c[1] / u[1] for c, u in zip(results["cached"], results["compiled each time"], strict=True)]
    print(f"CPU cached / compiled each time: {spread(ratios, unit=' x', width=6)} over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
