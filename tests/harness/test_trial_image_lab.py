"""The trial-image check on the lab, against stand-in images built on a worker with Docker.

The lab has no registry and no trainer image (trainer_docker_image_build is off there), so the images are
stand-ins, imported into the worker's Docker from its own Debian root: `dtlab-stand-in:py311` is
Debian's python3 3.11 with pip and without Debian's EXTERNALLY-MANAGED marker (as python:3.11-slim has
none); `dtlab-stand-in:py310` is the same with a .pth file that makes python3 report 3.10.12, standing in
for Determined's default image (Python 3.10).

Docker on a lab node stores and inspects images but cannot start a container: systemd-nspawn's seccomp
filter denies runc the keyctl (its session keyring) and bpf (cgroup v2's device filter) calls. So the check
runs for real through Docker up to `docker run`, which it reports; and the probe then enters each stand-in
by chroot into the image's exported root instead, the same probe, files and verdict as through Docker.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

import pytest

from dtlab import remote
from dtlab.bench import Bench, BenchOptions, PreflightError
from dtlab.cell import Cell
from dtlab.platforms import determined

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(1800)]

STAND_IN = "dtlab-stand-in"
ROOTS = "/var/tmp/dtlab-stand-in"
# python3 reporting 3.10.12 from startup on (platform.python_version, sys.version_info): a .pth line.
REPORTS_PY310 = (
    'import sys, collections; sys.version_info = collections.namedtuple("version_info", '
    '"major minor micro releaselevel serial")(3, 10, 12, "final", 0); '
    'sys.version = "3.10.12 " + sys.version.partition(" ")[2]'
)
# Built from the worker's own root: bash, python3 and the libraries they load (not the JVM, LLVM, ...).
BUILD_STAND_INS = (
    r"""
set -e
build() {  # build TAG [.pth line]: import the image, then export its root to ROOTS-TAG for chroot
    extra=$(mktemp -d); add=()
    if [ -n "${2:-}" ]; then
        mkdir -p "$extra/usr/lib/python3/dist-packages"
        printf '%s\n' "$2" > "$extra/usr/lib/python3/dist-packages/zz-dtlab-stand-in.pth"
        add=(-C "$extra" usr/lib/python3/dist-packages/zz-dtlab-stand-in.pth)
    fi
    tar -c -C / --one-file-system --exclude='libLLVM*' --exclude='libz3*' --exclude=perl --exclude=slurm-wlm \
        --exclude='libicu*' --exclude=gconv --exclude=systemd --exclude=EXTERNALLY-MANAGED \
        bin lib lib64 sbin etc usr/bin/bash usr/bin/sh usr/bin/dash usr/bin/python3 usr/bin/python3.11 \
        usr/bin/env usr/lib/x86_64-linux-gnu usr/lib/python3 usr/lib/python3.11 usr/lib64 "${add[@]}" \
        2>/dev/null | docker import - "STAND_IN:$1" >/dev/null
    rm -rf "$extra" "ROOTS-$1"; mkdir -p "ROOTS-$1"
    container=$(docker create "STAND_IN:$1" /bin/true)
    docker export "$container" | tar -x -C "ROOTS-$1"
    docker rm "$container" >/dev/null
}
build py311
build py310 PTH
""".replace("STAND_IN", STAND_IN)
    .replace("ROOTS", ROOTS)
    .replace("PTH", shlex.quote(REPORTS_PY310))
)
REMOVE_STAND_INS = (
    f"docker rmi -f {STAND_IN}:py311 {STAND_IN}:py310 >/dev/null 2>&1; rm -rf {ROOTS}-py311 {ROOTS}-py310"
)


def by_chroot(tag: str) -> str:
    """The probe's way into a stand-in here: chroot into its exported root (Docker's is refused)."""
    root = f"{ROOTS}-{tag}"
    copy = f'mkdir -p {root}{{probe_dir}} && cp "$staged"/* {root}{{probe_dir}}/'
    return f"{copy} && chroot {root} /bin/bash -c {{entry}}"


@pytest.fixture(scope="module")
def stand_ins(harness_lab):
    cluster, _ = harness_lab
    worker = cluster.workers[0]
    try:
        built = remote.run(worker, BUILD_STAND_INS, timeout=600)
        assert built.ok, built.stderr[-2000:]
        yield cluster, worker
    finally:
        remote.run(worker, REMOVE_STAND_INS, timeout=120)


def test_a_stand_in_python_310_image_is_refused_in_one_line_and_a_311_one_passes(stand_ins):
    cluster, worker = stand_ins
    # Through Docker, as on an agent: the image is there, and Docker names why it cannot run it here.
    (through_docker,) = determined.check_trial_image(cluster, [worker], image=f"{STAND_IN}:py311")
    assert not through_docker.ok
    assert "Docker there cannot run it (exit 125:" in through_docker.detail, through_docker.detail
    # Docker's own reason (the last line of its error) is there, whatever its wording: that varies with the
    # syscall nspawn's filter refuses first, and a check for one wording failed two full runs (2026-11-25,
    # 2026-11-26).
    assert re.search(r"\(exit 125: \S.*\); check that Docker runs it there", through_docker.detail), (
        through_docker.detail)

    (passes,) = determined.check_trial_image(
        cluster, [worker], image=f"{STAND_IN}:py311", run_probe=by_chroot("py311")
    )
    assert passes.ok, passes.detail
    assert passes.detail.startswith("python 3.11.2, pip 23.0.1: startup-hook.sh installs ")

    (refused,) = determined.check_trial_image(
        cluster, [worker], image=f"{STAND_IN}:py310", run_probe=by_chroot("py310")
    )
    assert not refused.ok and "\n" not in refused.detail
    assert refused.detail.startswith(
        f"determined: trial image {STAND_IN}:py310 on {worker.name} cannot install the pins: "
    ), refused.detail
    assert "needs Python >=3.11" in refused.detail and "the image has 3.10.12" in refused.detail
    assert "set determined_trial_image (inventory/group_vars/all.yml)" in refused.detail


def test_the_trainer_venv_on_a_node_holds_every_pin_so_the_hook_would_fetch_nothing(stand_ins):
    """The trainer role's venv has what the trainer image has (the same pins): pip's offline dry run of the
    hook's install, with the node's torch build file, has nothing to do. (The probe runs in the node's own
    root with the venv's python3 first on PATH; the image named only passes the command's Docker check.)"""
    cluster, worker = stand_ins
    in_venv = (
        'rm -rf {probe_dir} && cp -r "$staged" {probe_dir} && '
        f"PATH={cluster.venv_dir}/bin:$PATH bash -c {{entry}}; status=$?; rm -rf {{probe_dir}}; "
        "exit $status"
    )
    (found,) = determined.check_trial_image(cluster, [worker], image=f"{STAND_IN}:py311", run_probe=in_venv)
    assert found.ok and "every pin installed, startup-hook.sh has nothing to fetch" in found.detail, (
        found.detail
    )


def test_a_determined_cells_preflight_refuses_it_where_the_agents_lack_the_trial_image(harness_lab):
    """The lab builds no trainer image (trainer_docker_image_build: false), so no agent has the trial
    image. It has no Determined master either, so its own cells run off-cluster: here a lab cell's launch
    carries the cluster experiment, as a cell on a master does, and bench's preflight asks every agent."""
    cluster, _ = harness_lab
    cell = Cell("determined", 2, 1, 1)
    experiment = determined.ClusterExperiment(cluster, cell, {}, 60)
    planned = dataclasses.replace(determined.build(cluster, cell, 1, 60), external=experiment)
    bench = Bench(cluster, BenchOptions())
    with remote.Sessions() as bench.sessions, pytest.raises(PreflightError) as refused:
        bench.preflight(planned)
    line = str(refused.value)
    assert line.startswith(f"preflight: determined: trial image {determined.trial_image(cluster)} on "), line
    assert "Docker there has no such image" in line and "\n" not in line
    assert refused.value.node in {worker.name for worker in cluster.workers}
