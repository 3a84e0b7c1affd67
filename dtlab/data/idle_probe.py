"""dtlab's idle probe, run on a node by dtlab.idle (`python3 - CONFIG` with this file on stdin; the
standard library only, as on any node Ansible manages).

CONFIG (JSON): {"units": [unit file names], "cell_patterns": [...], "interval_s": seconds}. Prints one JSON
object: the cell units running (before and after; when one runs before, nothing is sampled), each unit's
members (the units PartOf it), and two samples `interval_s` apart on the node's monotonic clock. A sample
holds, per unit, systemd's view (LoadState, ActiveState, MemoryCurrent, CPUUsageNSec, ControlGroup) and
its processes' own figures (CPU ticks and PSS, from /proc), for nodes whose systemd keeps no accounts
(a container under a cgroup-v1 host, such as the lab's nodes).
"""

import json
import os
import subprocess
import sys
import time

PROPERTIES = ("LoadState", "ActiveState", "MemoryCurrent", "CPUUsageNSec", "ControlGroup", "ConsistsOf")
# Where a unit's ControlGroup lies: cgroup v2, or v1's named systemd hierarchy (hybrid, legacy).
CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd")


def systemctl(*args):
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=30).stdout


def show(units):
    """{unit: {property: value}}: `systemctl show` prints one block per unit, in the order asked."""
    blocks = systemctl("show", *(f"-p{p}" for p in PROPERTIES), "--", *units).strip().split("\n\n")
    shown = {}
    for unit, block in zip(units, blocks, strict=True):  # python3 >= 3.10 on the nodes
        shown[unit] = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
    return shown


def running_cells(patterns):
    listed = systemctl("list-units", "--plain", "--no-legend", "--state=active,activating", "--", *patterns)
    return [line.split()[0] for line in listed.splitlines() if line.split()]


def unit_pids(control_group):
    if not control_group:
        return []
    for root in CGROUP_ROOTS:
        top = root + control_group
        if os.path.isdir(top) and os.path.exists(os.path.join(top, "cgroup.procs")):
            pids = []
            for directory, _, files in os.walk(top):
                if "cgroup.procs" in files:
                    with open(os.path.join(directory, "cgroup.procs")) as procs:
                        pids += [int(pid) for pid in procs.read().split()]
            return pids
    return []


def process(pid):
    """(utime + stime + cutime + cstime in clock ticks, PSS in kB) of one process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (comm)", which may hold spaces
        ticks = sum(int(fields[index]) for index in (11, 12, 13, 14))
        kb = None
        for name, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
            try:
                with open(name) as memory:
                    kb = next((int(line.split()[1]) for line in memory if line.startswith(key)), None)
            except OSError:
                continue
            if kb is not None:
                break
        return [ticks, kb or 0]
    except (OSError, IndexError, ValueError):
        return None


def sample(units):
    at = time.monotonic_ns()
    shown = show(units)
    for values in shown.values():
        found = {pid: process(pid) for pid in unit_pids(values.get("ControlGroup", ""))}
        values["processes"] = {str(pid): figures for pid, figures in found.items() if figures is not None}
    return {"monotonic_ns": at, "units": shown}


def main():
    config = json.loads(sys.argv[1])
    cells = running_cells(config["cell_patterns"])
    if cells:
        print(json.dumps({"cells": cells}))
        return
    members = {unit: values.get("ConsistsOf", "").split() for unit, values in show(config["units"]).items()}
    every = list(dict.fromkeys(config["units"] + [m for found in members.values() for m in found]))
    first = sample(every)
    time.sleep(config["interval_s"])
    second = sample(every)
    print(json.dumps({"cells": running_cells(config["cell_patterns"]), "members": members,
                      "clock_ticks_per_s": os.sysconf("SC_CLK_TCK"), "samples": [first, second]}))


if __name__ == "__main__":
    main()
