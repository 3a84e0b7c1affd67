"""The controller's venv installed by pip and by uv, side by side, as on a fresh machine (issue #50: setup.sh
installs it with uv since 9728da0). Each round makes two empty venvs and two empty caches, then installs
setup.sh's package set into each: pip as setup.sh did before (`pip install --no-compile -c constraints.txt
-e .[test] <the platforms' clients>`), uv as setup.sh does now (the same, from pip's configuration:
dtlab/pipconfig.py). Wall time and the children's CPU seconds, min/median/max over rounds; the two take
turns, the first alternating by round. Both download what the machine's indexes do not hold, so the
network's speed is in both figures.

    .venv/bin/python benchmarks/venv_install.py [--rounds 3]

Run it alone on a quiet machine (benchmarks/README.md). It needs about 7 GB of scratch space under /tmp.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._trainer_common import machine, spread  # noqa: E402
from dtlab import paths, pins, pipconfig  # noqa: E402

WAYS = ("pip", "uv")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def install(way: str, scratch: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one fresh venv's install, its cache empty."""
    venv = scratch / f"venv-{way}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    packages = ["-c", str(paths.CONSTRAINTS_FILE), f"-e{REPO}[test]", *pins.platform_clients()]
    env = {**os.environ, "PYTHONWARNINGS": "ignore::UserWarning",
           "PIP_CACHE_DIR": str(scratch / "pip-cache"), "UV_CACHE_DIR": str(scratch / "uv-cache")}
    python = venv / "bin/python"
    if way == "pip":
        command = [str(python), "-m", "pip", "install", "-q", "--no-compile", *packages]
    else:
        command, uv_environment = pipconfig.uv_install(python, *packages)
        env |= uv_environment
    cpu_before, started = children_cpu_s(), time.perf_counter()
    subprocess.run(command, env=env, check=True, timeout=3600, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - started, children_cpu_s() - cpu_before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"venv_install: {args.rounds} rounds; {machine()}")
    walls: dict[str, list[float]] = {way: [] for way in WAYS}
    cpus: dict[str, list[float]] = {way: [] for way in WAYS}
    for round_number in range(args.rounds):
        order = WAYS if round_number % 2 == 0 else WAYS[::-1]
        for way in order:
            with tempfile.TemporaryDirectory(prefix=f"venv-install-{way}-") as scratch:
                wall, cpu = install(way, Path(scratch))
            walls[way].append(wall)
            cpus[way].append(cpu)
            print(f"  round {round_number + 1} {way}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    print(f"\n{'way':<5}{'wall (s)':>28}{'CPU (s)':>28}")
    for way in WAYS:
        print(f"{way:<5}{spread(walls[way], '.1f'):>28}{spread(cpus[way], '.1f'):>28}")
    ratios = [u / p for u, p in zip(walls["uv"], walls["pip"], strict=True)]
    print(f"\nuv / pip, wall, per round: {spread(ratios)} over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
