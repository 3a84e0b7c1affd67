"""The pieces of dtlab.remote and dtlab.bench that need no node: unit scripts, log lines, guard, ETA."""

import dataclasses
import fnmatch
import socket
import subprocess
import sys
import time

import pytest
import yaml

from dtlab import bench, paths, remote, roles
from dtlab.cell import Cell
from dtlab.display import Display
from dtlab.outcome import CellOutcome


def test_a_cell_unit_is_named_and_bounded_and_its_script_is_valid_shell(tmp_path):
    spec = remote.UnitSpec(
        unit=remote.unit_name("ddp-g2-e2-s0", "node1"),
        argv=["/opt/v/bin/python", "-m", "x y"],
        log_path="/var/lib/dtlab/runs/ddp-g2-e2-s0/attempt-1/node1.log",
        user="dtlab",
        workdir="/opt/dtlab/src",
        env={"OMP_NUM_THREADS": "1"},
        environment_files=("/etc/dtlab/socket.env",),
        runtime_max_s=600,
    )
    script = remote.unit_script(spec)
    assert spec.unit == "dtlab-ddp-g2-e2-s0-node1"
    for part in (
        "systemd-run",
        "--collect",
        "--wait",
        "--unit=dtlab-ddp-g2-e2-s0-node1",
        "--property=RuntimeMaxSec=600",
        "--property=User=dtlab",
        "--setenv=OMP_NUM_THREADS=1",
        "--property=EnvironmentFile=/etc/dtlab/socket.env",
        "'x y'",
        "tail -n +1 -F",
    ):
        assert part in script
    syntax = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


SYSTEMD_RUN_STAND_IN = """#!/bin/sh
# Stand-in for systemd-run --wait (no systemd in this test): run the command after "--" with its output
# appended to the StandardOutput= file, and exit with its status.
log=
while [ "$1" != "--" ]; do
  case "$1" in --property=StandardOutput=append:*) log=${1#*append:};; esac; shift
done
shift; "$@" >> "$log" 2>&1
"""


def test_a_unit_stream_ends_with_the_unit_and_carries_every_line(tmp_path):
    """The follower stops by itself once the unit's waiter returns, after the log's last line."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "systemd-run").write_text(SYSTEMD_RUN_STAND_IN)
    (shims / "systemctl").write_text("#!/bin/sh\nexit 0\n")
    for shim in shims.iterdir():
        shim.chmod(0o755)
    burst = "for i in $(seq 1 500); do echo line-$i; done; exit 7"
    spec = remote.UnitSpec(unit="dtlab-ddp-g1-e2-s0-node1", argv=["sh", "-c", burst],
                           log_path=str(tmp_path / "attempt" / "node1.log"))
    finished = subprocess.run(["sh", "-c", remote.unit_script(spec)], capture_output=True, text=True,
                              timeout=30, env={"PATH": f"{shims}:/usr/bin:/bin"})
    assert finished.returncode == 7
    assert finished.stdout.splitlines() == [f"line-{i}" for i in range(1, 501)]


def test_cell_unit_patterns_never_match_the_provisioned_services():
    def matches(unit):
        return any(fnmatch.fnmatchcase(unit, pattern + ".service") for pattern in remote.CELL_UNIT_PATTERNS)

    for cell_unit in (
        "dtlab-ddp-g1-e2-s0-node1",
        "dtlab-spark-g2-e20-s3-node0",
        "dtlab-determined-g8-e1-s0-w4",
    ):
        assert matches(cell_unit + ".service")
    # Every provisioned service, as the inventory names it (the *_service variables of group_vars/all.yml and
    # of every role's defaults, where a unit one role runs is named).
    site = yaml.safe_load((paths.INVENTORY_DIR / "group_vars" / "all.yml").read_text())
    all_vars = {**roles.all_defaults(), **site}
    services = [str(unit) for name, unit in all_vars.items() if name.endswith("_service")]
    assert len(services) >= 5
    for service in services:
        assert not matches(service + ".service")


def test_log_lines_are_split_prefixed_by_node_and_saved(tmp_path):
    seen = []
    writer = remote._LineWriter("node2", lambda node, line: seen.append((node, line)), tmp_path / "node2.log")
    writer.write("epoch 1/2 ")
    writer.write("done\r\nsecond line\npartial")
    writer.close()
    assert seen == [("node2", "epoch 1/2 done"), ("node2", "second line"), ("node2", "partial")]
    assert (tmp_path / "node2.log").read_text() == "epoch 1/2 done\nsecond line\npartial\n"


def test_no_packet_to_a_lab_address_without_the_guard():
    remote.assert_safe_target("127.0.0.1")  # loopback and DNS names are not the lab's business
    remote.assert_safe_target("node1.example.org")
    # In a fresh network namespace no guard route exists yet: a lab address is refused, before any
    # connection; once the namespace blackholes the range, it passes.
    probe = ("from dtlab import remote; from dtlab.inventory import Node; "
             "remote.assert_safe_target('10.213.77.11'); print('allowed')")
    without = subprocess.run(["unshare", "--net", sys.executable, "-c", probe],
                             cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert without.returncode != 0
    assert "the guard route `blackhole 10.213.0.0/16` is missing" in without.stderr
    with_guard = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip route add blackhole 10.213.0.0/16 && exec "$@"', "sh",
         sys.executable, "-c", probe], cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert with_guard.returncode == 0 and with_guard.stdout.strip() == "allowed", with_guard.stderr


def _node(address):
    from dtlab.inventory import Node

    return Node(name="n", address=address, groups=("workers",), ssh_user="root")


def test_eta_comes_from_measured_cell_times_per_framework():
    cells = [Cell("ddp", 1, 2, 0), Cell("spark", 1, 2, 0), Cell("ddp", 2, 2, 0), Cell("spark", 2, 2, 0)]
    display = Display(len(cells), verbose=False)
    display.pending = list(cells)
    assert display.eta_seconds() is None  # nothing measured yet
    for cell, seconds in zip(cells[:2], (10.0, 100.0), strict=True):
        display.start_cell(cell, 1)
        display.finish_cell(CellOutcome(cell, "ok", 1, seconds))
    assert display.eta_seconds() == pytest.approx(110.0)
    display.start_cell(cells[2], 1)
    display.current_started = time.monotonic() - 4.0
    assert display.eta_seconds() == pytest.approx(6.0 + 100.0, abs=0.5)
    assert (display.done, display.failed) == (2, 0)


def test_a_failure_is_explained_by_its_exception_line_not_torchruns_wrapper(tmp_path):
    (tmp_path / "n.log").write_text(
        "[trainer] epoch 1/2: train 1.0s\nTraceback (most recent call last):\n"
        "AssertionError: chief_ip was none provided\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
    )
    from concurrent.futures import Future

    future = Future()
    future.set_result(remote.CommandResult("node2", 1, "", ""))
    failure = bench.Bench._job_failure(None, _node("127.0.0.9"), future, tmp_path, elapsed=3.0, timeout_s=60)
    assert failure.reason == "exit 1 on n: AssertionError: chief_ip was none provided"
    assert failure.exit_code == 1 and failure.log_tail[-1].startswith("  traceback")


def test_units_down_names_a_node_that_does_not_answer_once():
    from dtlab.platforms.base import units_down, why_not

    with socket.socket() as unused:  # a loopback port nothing listens on: ssh is refused at once
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    node = dataclasses.replace(_node("127.0.0.1"), name="node2", ssh_port=port)
    down = units_down([node], "dtlab-ray-worker", sessions=None)
    assert len(down) == 1 and down[0].startswith("node2 (127.0.0.1): ssh failed"), down
    assert why_not(down).count("node2") == 1 and why_not([]) == ""
