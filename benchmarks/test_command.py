"""How long the test commands take.

    .venv/bin/python benchmarks/test_command.py --tiers default,all [--rounds 3] [--fresh]
    .venv/bin/python benchmarks/test_command.py --baseline REV [--rounds 3] [--args '--fast']

--tiers: each tier's command (`invoke test`, `invoke test --all`, `invoke test --fast`) on this tree, in
turns, each round; per tier the wall time and the core-minutes the whole machine was busy meanwhile
(/proc/stat), min/median/max over rounds, against the targets (default tier <= 20 min with setup.sh, full
tier <= 60 min; issue 50). --fresh removes, before every run, what dtlab builds once per machine (the lab's
node image, the Horovod wheel and its cache, the test lab's bundle, the wheelhouse and the lab test venv),
so that each run pays what a fresh machine pays but for setup.sh (pip's cache and the venv stay).

--baseline: the inner loop, `invoke test --fast`, on this tree and on a baseline commit, taking turns
in one run (target: <= 150 s, issue 29).

Three contenders per round: the baseline; this tree with ansible-lint run (its kept pass deleted first,
as after a change to a role); this tree with the pass kept (the usual inner loop: no Ansible file changed).
The baseline runs from a git worktree of REV in a temporary folder (removed at the end), with this tree's
venv and Ansible collections linked in, so both run the same packages. The baseline goes first in odd
rounds and last in even ones. Prints each contender's wall time min/median/max and the per-round ratios
to the baseline. Exit status 1 when a run failed, or when the kept-pass median misses the target. Run it
alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dtlab.commands import ANSIBLE_LINT_PASSED

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._trainer_common import spread  # noqa: E402

TARGET_S = 150.0
RUN_TIMEOUT_S = 2 * 3600  # the full tier's target is an hour; twice that means something hangs
# Ignored paths the tests need that a worktree lacks: the venv, and the collections setup.sh installs.
SHARED_PATHS = (".venv", ".dtlab/collections")


def baseline_tree(rev: str, scratch: Path) -> Path:
    tree = scratch / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(tree), rev],
                   check=True, timeout=120)
    for shared in SHARED_PATHS:
        (tree / shared).parent.mkdir(parents=True, exist_ok=True)
        (tree / shared).symlink_to(REPO / shared)
    return tree


def timed_run(tree: Path, args: list[str], keep: Path | None = None) -> tuple[float, bool, str]:
    """(seconds, passed, pytest's summary line, or on a failure also the lines that say why); the whole
    output goes to `keep` when given (pytest's slowest tests are at its end)."""
    # PYTHONPATH first: the venv's editable install of dtlab points at this tree, not the worktree.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.monotonic()
    finished = subprocess.run([str(REPO / ".venv/bin/invoke"), "test", *args], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if keep:
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.write_text(finished.stdout + finished.stderr)
    summary = next((line for line in reversed(finished.stdout.splitlines()) if " in " in line and
                    ("passed" in line or "failed" in line)), "(no pytest summary)")
    summary = summary.strip("= ")
    if finished.returncode != 0:  # the failing test or linter, so a failed round is never a silent one
        lines = finished.stdout.splitlines()
        why = [line for line in lines if line.startswith(("FAILED", "ERROR", "lint ("))]
        summary += "\n    " + "\n    ".join(why[:5] + lines[-3:])
    return time.monotonic() - started, finished.returncode == 0, summary


# What --fresh removes: dtlab's once-per-machine builds (a fresh machine has none of them).
FRESH_PATHS = (Path("/var/cache/dtlab/images"), Path.home() / ".cache/dtlab/horovod-wheels",
               REPO / ".dtlab/bundles", REPO / ".dtlab/wheelhouse", REPO / ".dtlab/lab-testvenv",
               REPO / ".dtlab/horovod-build-venv", REPO / ".dtlab/horovod-prebuild-venv")
TIER_ARGS = {"default": [], "all": ["--all"], "fast": ["--fast"]}
TIER_TARGET_S = {"default": 20 * 60, "all": 60 * 60}


def busy_core_seconds() -> float:
    """Seconds of CPU time the whole machine has spent busy since boot (all cores; not idle, not iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def tiers_main(tiers: list[str], rounds: int, fresh: bool) -> int:
    import shutil

    print(f"load average at the start: {os.getloadavg()[0]:.2f} (figures need < 1.5); "
          f"tiers {', '.join(tiers)}, {rounds} round(s){', fresh' if fresh else ''}", flush=True)
    walls: dict[str, list[float]] = {tier: [] for tier in tiers}
    cores: dict[str, list[float]] = {tier: [] for tier in tiers}
    failed = []
    for round_index in range(rounds):
        for tier in tiers if round_index % 2 == 0 else tiers[::-1]:
            if fresh:
                for path in FRESH_PATHS:
                    shutil.rmtree(path, ignore_errors=True)
            busy = busy_core_seconds()
            keep = REPO / ".dtlab" / "logs" / f"test-command-{tier}-round{round_index + 1}.log"
            seconds, ok, summary = timed_run(REPO, TIER_ARGS[tier], keep)
            walls[tier].append(seconds)
            cores[tier].append((busy_core_seconds() - busy) / 60)
            print(f"round {round_index + 1} {tier:8s} {seconds / 60:6.1f} min, "
                  f"{cores[tier][-1]:5.1f} core-min  {summary}{'' if ok else '  FAILED'} (output: {keep})",
                  flush=True)
            if not ok:
                failed.append(f"round {round_index + 1} {tier}")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    missed = []
    for tier in tiers:
        wall, core = walls[tier], cores[tier]
        target = TIER_TARGET_S.get(tier)
        print(f"{tier:8s} wall {statistics.median(wall) / 60:.1f} min "
              f"[{min(wall) / 60:.1f}-{max(wall) / 60:.1f}], busy {statistics.median(core):.1f} core-min "
              f"[{min(core):.1f}-{max(core):.1f}], n={len(wall)}"
              + (f"; target <= {target / 60:.0f} min, setup.sh's own time not included" if target else ""))
        if target and statistics.median(wall) > target:
            missed.append(tier)
    if failed:
        print(f"failed runs: {', '.join(failed)}")
    if missed:
        print(f"targets missed: {', '.join(missed)}")
    return 1 if failed or missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiers", help="comma-separated tiers to time: default, all, fast")
    parser.add_argument("--fresh", action="store_true",
                        help="with --tiers: remove dtlab's once-per-machine builds before each run")
    parser.add_argument("--baseline", help="the commit to compare --args with (e.g. HEAD~3)")
    parser.add_argument("--rounds", type=int, default=3, help="each runs every contender once (default 3)")
    parser.add_argument("--args", default="--fast", help="what follows `invoke test` (default: --fast)")
    arguments = parser.parse_args()
    if arguments.rounds < 1:
        parser.error(f"--rounds {arguments.rounds}: needs at least 1")
    if arguments.tiers:
        tiers = [tier.strip() for tier in arguments.tiers.split(",") if tier.strip()]
        unknown = [tier for tier in tiers if tier not in TIER_ARGS]
        if unknown or not tiers:
            parser.error(f"--tiers {arguments.tiers}: tiers are {', '.join(TIER_ARGS)}")
        return tiers_main(tiers, arguments.rounds, arguments.fresh)
    if not arguments.baseline:
        parser.error("give --tiers, or --baseline for the inner loop's comparison")
    resolved = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet",
                               f"{arguments.baseline}^{{commit}}"], capture_output=True, text=True)
    if resolved.returncode != 0:
        parser.error(f"--baseline {arguments.baseline}: not a commit of {REPO}")
    args = shlex.split(arguments.args)
    print(f"load average at the start: {os.getloadavg()[0]:.2f} (figures need < 1.5); "
          f"`invoke test {arguments.args}`, {arguments.rounds} round(s)", flush=True)
    contenders = ("baseline", "this tree, ansible-lint run", "this tree, lint pass kept")
    times: dict[str, list[float]] = {name: [] for name in contenders}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dtlab-testcmd-") as scratch:
        baseline = baseline_tree(resolved.stdout.strip(), Path(scratch))
        try:
            for round_index in range(arguments.rounds):
                order = contenders if round_index % 2 == 0 else (*contenders[1:], contenders[0])
                for name in order:
                    if name == "this tree, ansible-lint run":
                        ANSIBLE_LINT_PASSED.unlink(missing_ok=True)
                    seconds, ok, summary = timed_run(baseline if name == "baseline" else REPO, args)
                    times[name].append(seconds)
                    print(f"round {round_index + 1} {name:27s} {seconds:6.1f} s  {summary}"
                          f"{'' if ok else '  FAILED'}", flush=True)
                    if not ok:
                        failed.append(f"round {round_index + 1} {name}")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)],
                           timeout=120, check=False)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    for name, values in times.items():
        print(f"{name:27s} {spread(values, '.1f', ' s', count=True, width=6)}")
    for name in contenders[1:]:
        ratios = [mine / base for mine, base in zip(times[name], times["baseline"], strict=True)]
        print(f"{name} / baseline per round: {' '.join(f'{r:.2f}' for r in ratios)}; "
              f"medians {statistics.median(times[name]) / statistics.median(times['baseline']):.2f}")
    kept = statistics.median(times["this tree, lint pass kept"])
    target_missed = args == ["--fast"] and kept > TARGET_S
    if args == ["--fast"]:  # the target is the inner loop's
        print(f"target <= {TARGET_S:.0f} s (lint pass kept): {'missed' if target_missed else 'met'}")
    if failed:
        print(f"failed runs: {', '.join(failed)}")
    return 1 if failed or target_missed else 0


if __name__ == "__main__":
    sys.exit(main())
