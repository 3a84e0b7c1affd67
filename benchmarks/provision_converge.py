"""Provisioning speed: the first `ansible-playbook site.yml` on fresh lab nodes, then idempotent re-runs
under stock Ansible (strategy `linear`) and under Mitogen (`mitogen_linear`, dtlab's own converges),
alternating, side by side in one run (target for the re-run: <= 60 s).

    sudo .venv/bin/python benchmarks/provision_converge.py [--name provbench] [--rounds 3] [--keep]
    sudo .venv/bin/python benchmarks/provision_converge.py --reuse    # an already converged instance

Brings up its own lab instance (fresh nodes) unless --reuse, converges once, then runs `--rounds`
pairs of re-runs (the order inside a pair alternates) and prints min/median/max per strategy and the
ratio of their medians. Brings the instance down unless --keep or --reuse. The controller's wheelhouse
(.dtlab/wheelhouse) is reused when it is already filled for the same constraints: say so in the
figures you record.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import dtlab.lab
from dtlab import paths, provision

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._trainer_common import spread  # noqa: E402

RERUN_TARGET_S = 60.0
STRATEGIES = ("linear", "mitogen_linear")  # stock Ansible (ansible.cfg); dtlab.provision.CONVERGE_STRATEGY


def rerun(inventory, strategy: str) -> provision.ConvergeResult:
    os.environ["ANSIBLE_STRATEGY"] = strategy  # ansible-runner passes the environment on
    try:
        return provision.converge(inventory)
    finally:
        del os.environ["ANSIBLE_STRATEGY"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="provbench", help="lab instance to use (wiped first)")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of re-runs (default 3)")
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    parser.add_argument("--reuse", action="store_true", help="use the instance as it is (up, converged)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: needs at least 1")

    load_at_start = os.getloadavg()[0]  # a figure measured on a busy machine is not a figure
    wheelhouse_warm = (paths.WHEELHOUSE_DIR / ".dtlab-stamp").exists()
    if args.reuse:
        inventory = paths.REPO_ROOT / "inventory" / f"lab-{args.name}.yml"
        if not inventory.is_file():
            parser.error(f"--reuse: no lab instance {args.name} ({inventory} is missing)")
    else:
        dtlab.lab.down(args.name, wipe=True)
        inventory = dtlab.lab.up(args.name).inventory_path
    seconds: dict[str, list[float]] = {strategy: [] for strategy in STRATEGIES}
    changed: dict[str, int] = dict.fromkeys(STRATEGIES, 0)
    try:
        if (first := None if args.reuse else provision.converge(inventory)) and not first.ok:
            print(f"first converge failed: {first.summary()}\n{first.output[-3000:]}", file=sys.stderr)
            return 1
        for round_index in range(args.rounds):
            order = STRATEGIES if round_index % 2 == 0 else STRATEGIES[::-1]
            for strategy in order:
                result = rerun(inventory, strategy)
                if not result.ok:
                    print(f"re-run ({strategy}) failed: {result.summary()}", file=sys.stderr)
                    return 1
                seconds[strategy].append(result.seconds)
                changed[strategy] += sum(result.stats.get("changed", {}).values())
                print(f"round {round_index + 1} {strategy}: {result.seconds:.1f} s", flush=True)
    finally:
        if not args.keep and not args.reuse:
            dtlab.lab.down(args.name, wipe=True)

    print(f"lab {args.name}; wheelhouse {'warm' if wheelhouse_warm else 'cold'}; load average before: "
          f"{load_at_start:.2f}")
    if first is not None:
        print(f"first converge: {first.seconds:.1f} s, "
              f"{sum(first.stats.get('changed', {}).values())} changed tasks")
    print(f"{'idempotent re-run':<28}{'median [min-max] n':>30}{'changed tasks':>16}")
    for strategy in STRATEGIES:
        print(f"{strategy:<28}{spread(seconds[strategy], '.1f', count=True):>30}{changed[strategy]:>16}")
    stock, ours = (statistics.median(seconds[s]) for s in STRATEGIES)
    best = min(seconds["mitogen_linear"])
    verdict = "met" if ours <= RERUN_TARGET_S else "MISSED"
    pairs = zip(seconds["linear"], seconds["mitogen_linear"], strict=True)
    print(f"mitogen_linear / linear (medians): {ours / stock:.2f}; per-round ratios: "
          + " ".join(f"{mitogen / linear:.2f}" for linear, mitogen in pairs))
    print(f"re-run (mitogen_linear median) / target ({RERUN_TARGET_S:.0f} s): {ours / RERUN_TARGET_S:.2f} "
          f"({verdict}; best round {best:.1f} s)")
    return 0 if verdict == "met" and not any(changed.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
