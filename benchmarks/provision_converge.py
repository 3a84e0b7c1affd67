"""Provisioning speed: the first `ansible-playbook site.yml` on fresh lab nodes, then the idempotent
re-run (target: <= 90 s), side by side in one run.

    sudo .venv/bin/python benchmarks/provision_converge.py [--name provbench] [--keep]

Brings up its own lab instance (fresh nodes), converges twice, prints both times and their ratio,
and brings the instance down unless --keep. The controller's wheelhouse (.dtlab/wheelhouse) is
reused when it is already filled for the same constraints: say so in the figures you record.
"""

from __future__ import annotations

import argparse
import sys

import dtlab.lab
from dtlab import paths, provision

RERUN_TARGET_S = 90.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="provbench", help="lab instance to use (wiped first)")
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    args = parser.parse_args()

    wheelhouse_warm = (paths.WHEELHOUSE_DIR / ".dtlab-stamp").exists()
    dtlab.lab.down(args.name, wipe=True)
    lab = dtlab.lab.up(args.name)
    try:
        first = provision.converge(lab.inventory_path)
        if not first.ok:
            print(f"first converge failed: {first.summary()}\n{first.output[-3000:]}", file=sys.stderr)
            return 1
        rerun = provision.converge(lab.inventory_path)
        if not rerun.ok:
            print(f"re-run failed: {rerun.summary()}", file=sys.stderr)
            return 1
    finally:
        if not args.keep:
            dtlab.lab.down(args.name, wipe=True)

    print(f"lab {args.name}: {len(lab.node_names)} nodes; wheelhouse {'warm' if wheelhouse_warm else 'cold'}")
    print(f"{'run':<28}{'seconds':>10}{'changed tasks':>16}")
    for label, result in (("first converge", first), ("idempotent re-run", rerun)):
        changed = sum(result.stats.get("changed", {}).values())
        print(f"{label:<28}{result.seconds:>10.1f}{changed:>16}")
    verdict = "met" if rerun.seconds <= RERUN_TARGET_S else "MISSED"
    print(f"re-run / first: {rerun.seconds / first.seconds:.2f}; "
          f"re-run / target ({RERUN_TARGET_S:.0f} s): {rerun.seconds / RERUN_TARGET_S:.2f} ({verdict}); "
          f"re-run changed hosts: {rerun.changed_hosts or 'none'}")
    return 0 if rerun.seconds <= RERUN_TARGET_S and not rerun.changed_hosts else 1


if __name__ == "__main__":
    sys.exit(main())
