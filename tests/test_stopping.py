"""A run of the suite stopped with SIGTERM, or with SIGINT where a shell started it in the background (which
leaves SIGINT ignored), still tears its session fixtures down (tests/conftest.py): the session lab and the
loopback clusters do not outlive it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STOP_WITHIN_S = 60

# One session fixture that records its teardown, and a test that waits in it.
HELD_SESSION = """
import time

import pytest


@pytest.fixture(scope="session")
def held():
    yield
    open({done!r}, "w").write("torn down")


def test_waits(held):
    open({started!r}, "w").write("started")
    time.sleep(300)
"""


@pytest.mark.slow  # a pytest of its own, with this suite's conftest (torch's import): seconds
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_run_tears_its_session_fixtures_down(tmp_path, stop):
    started, done = tmp_path / "started", tmp_path / "done"
    test_file = tmp_path / "test_held.py"
    test_file.write_text(HELD_SESSION.format(started=str(started), done=str(done)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "--rootdir",
               str(tmp_path), str(test_file)]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `&` starts it; the child inherits it
    try:
        run = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + STOP_WITHIN_S
        while not started.exists():
            assert run.poll() is None, run.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the inner test never started"
            time.sleep(0.1)
        run.send_signal(stop)
        output, _ = run.communicate(timeout=STOP_WITHIN_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=30)
    assert run.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert done.read_text() == "torn down", output[-3000:]
    assert f"pytest stopped by {stop.name}" in output or stop == signal.SIGINT, output[-3000:]
