"""Shared pytest fixtures. Each section belongs to one part of dtlab; add yours as its own section."""

import fcntl
import os
import signal
import subprocess
import sys
import threading

import lab_session
import pytest

# --- one process for torch and Ansible -----------------------------------------------------------------
# ansible-core replaces sys.intern with a patch object once its templar runs; torch._dynamo, imported
# later by transformers, then fails to register its sys polyfills. Only the test process holds both
# (the harness never trains in-process), so load dynamo first here.
import torch._dynamo  # noqa: E402,F401  isort: skip

from dtlab.pins import pinned  # noqa: E402

# --- a stopped run still tears down ---------------------------------------------------------------------
# A run started in the background inherits SIGINT ignored (a shell's `&`), and SIGTERM ends a process without
# its teardown: the session lab and the loopback clusters would outlive the run. Both now raise
# KeyboardInterrupt, on which pytest stops and runs every fixture's teardown (the lab goes down).


def _stop_the_run(signum, _frame):
    raise KeyboardInterrupt(f"pytest stopped by {signal.Signals(signum).name}")


def pytest_configure(config):
    if threading.current_thread() is threading.main_thread():  # only there may Python set a handler
        signal.signal(signal.SIGTERM, _stop_the_run)
        signal.signal(signal.SIGINT, signal.default_int_handler)

# --- lab: one lab instance for the whole session (tests/lab/, provisioning, harness) ------------------

# Its own instance, so running the tests never touches a user's lab ("dtlab") or another engineer's.
TEST_LAB_NAME = os.environ.get("DTLAB_TEST_LAB_NAME", "dtlabtest")
LAB_TEST_TORCH = f"torch=={pinned('torch')}"
LAB_TEST_WHEELS = "/opt/wheels"
# The fixtures whose tests need the lab converged: with one of them selected, the lab step converges it.
CONVERGED_LAB_FIXTURES = {"provisioned_lab", "harness_lab"}


def _claim_test_lab_name():
    """The first of dtlabtest, dtlabtest2, ... that no other pytest session is using (held until exit)."""
    from dtlab.lab.config import LAB_RUN_ROOT

    LAB_RUN_ROOT.mkdir(parents=True, exist_ok=True)
    for index in range(1, 6):
        name = TEST_LAB_NAME if index == 1 else f"{TEST_LAB_NAME}{index}"
        session_lock = open(LAB_RUN_ROOT / f".{name}.session", "w")  # noqa: SIM115 (held for the session)
        try:
            fcntl.flock(session_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return name, session_lock
        except BlockingIOError:
            session_lock.close()
    pytest.fail(f"five pytest sessions already use test labs {TEST_LAB_NAME}..{TEST_LAB_NAME}5")


class LabPreparation:
    """The session lab's three steps (tests/lab_session.py), each a process of its own: the two builds,
    started when collection is done, then the lab's start (and first converge), started by `advance()`
    between tests once both builds have ended well. `wait()` returns when the steps have ended and fails
    the calling test with the log of one that failed.
    """

    def __init__(self, name: str, converge: bool):
        self.name = name
        self.converge = converge
        self.processes: dict[str, subprocess.Popen] = {}
        self.taken_down = False
        for step in lab_session.BUILD_STEPS:
            self._start(step)

    def _start(self, step: str, *args: str) -> None:
        log = lab_session.log_path(self.name, step)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            self.processes[step] = subprocess.Popen(
                [sys.executable, lab_session.__file__, step, self.name, *args], stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def advance(self) -> None:
        """Starts the lab step if both builds have ended well and it has not started (cheap: polls)."""
        builds = [self.processes[step] for step in lab_session.BUILD_STEPS]
        if lab_session.LAB_STEP not in self.processes and all(build.poll() == 0 for build in builds):
            self._start(lab_session.LAB_STEP, *(["--converge"] if self.converge else []))

    def wait(self, step: str | None = None) -> None:
        """Until `step` has ended (None: all three, the lab's start last)."""
        for each in [step] if step else lab_session.STEPS:
            if each == lab_session.LAB_STEP:
                self.advance()  # the builds before it ended well, or a failed one failed the test
            process = self.processes[each]
            try:
                process.wait(timeout=lab_session.PREPARE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.stop()
            if process.returncode != 0:
                log = lab_session.log_path(self.name, each)
                pytest.fail(f"the test lab's {each} step failed (exit {process.returncode}); {log}:\n"
                            + log.read_text(errors="replace")[-4000:])

    def stop(self) -> None:
        """Ends a step still running (by its own process group), and takes down a lab the lab step
        started: also when the session ends before any lab test ran."""
        from dtlab.waiting import stop_process_group

        for process in self.processes.values():
            stop_process_group(process)
        if lab_session.LAB_STEP in self.processes:
            self.take_down()

    def take_down(self) -> None:
        """The lab down (wiped unless DTLAB_TEST_LAB_KEEP=1), once."""
        import dtlab.lab

        if not self.taken_down:
            self.taken_down = True
            dtlab.lab.down(self.name, wipe=not lab_session.KEEP_TEST_LAB)


def pytest_collection_finish(session):
    _run_lab_tests_last(session)
    # Where each loopback cluster's last test is, in the order the tests run: it stops there.
    session.config.dtlab_last_users = {
        name: users[-1] for name in LOOPBACK_CLUSTERS
        if (users := [item.nodeid for item in session.items if name in getattr(item, "fixturenames", ())])}


def _run_lab_tests_last(session):
    """With lab tests selected (and root): claim the session's lab name, start its builds, and run the lab
    tests last, so that the tests that need no lab run while the lab is prepared."""
    lab_items = [item for item in session.items if item.get_closest_marker("lab")]
    session.config.dtlab_lab = None
    if not lab_items or os.geteuid() != 0 or session.config.option.collectonly:
        return
    converge = not lab_session.EXISTING_LAB_INVENTORY and any(
        CONVERGED_LAB_FIXTURES & set(item.fixturenames) for item in lab_items)
    name, session_lock = _claim_test_lab_name()  # parallel sessions never share (and wipe) one lab
    session.config.dtlab_lab = (name, session_lock, LabPreparation(name, converge))
    session.items[:] = [item for item in session.items if not item.get_closest_marker("lab")] + lab_items


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Between tests: start the lab step as soon as the builds allow; stop a loopback cluster after its last
    test."""
    claimed = getattr(item.config, "dtlab_lab", None)
    if claimed:
        claimed[2].advance()
    for name, last_user in getattr(item.config, "dtlab_last_users", {}).items():
        if item.nodeid == last_user and name in _LOOPBACK_STOPS:
            _LOOPBACK_STOPS.pop(name)()


def pytest_unconfigure(config):
    claimed = getattr(config, "dtlab_lab", None)
    if claimed:
        _, session_lock, preparation = claimed
        preparation.stop()
        session_lock.close()


@pytest.fixture(scope="session")
def lab_preparation(request) -> LabPreparation | None:
    """The session lab's builds when this session started them (None in a session without lab tests)."""
    claimed = getattr(request.config, "dtlab_lab", None)
    return claimed[2] if claimed else None


@pytest.fixture(scope="session")
def lab(request, lab_preparation):
    """The up test lab (a dtlab.lab.LabConfig): `lab.inventory_path`, `lab.node_names`, `lab.name`, ...

    An offline lab (`invoke lab.up --bundle`): no apt proxy, so its nodes have no way out, and every converge
    installs from the bundle built first (tests/lab_session.py); every lab test, the smoke matrix among them,
    runs on nodes that fetched nothing from outside (#32). Brought up (and converged, for `provisioned_lab`)
    in the background while the other tests run. Fresh nodes each session (unless DTLAB_TEST_LAB_KEEP=1);
    always brought down at the end, also when a test fails or the session ends early. Needs root.
    """
    import dtlab.lab

    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    if lab_preparation is None:  # only a test marked lab gets the lab prepared (pytest_collection_finish)
        pytest.fail("a test that uses the session lab must be marked lab (tests/conftest.py prepares it)")
    lab_preparation.wait()
    try:
        yield dtlab.lab.load_config(lab_preparation.name)
    finally:
        lab_preparation.take_down()


@pytest.fixture(scope="session")
def lab_torch_python(lab):
    """Path, inside the test lab's nodes, of a python3 that has torch (built once, cached in .dtlab/)."""
    venv_dir = lab_session.lab_test_venv_dir()
    if not (venv_dir / "complete").exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(venv_dir)], check=True, timeout=300)
        # As the trainer role does: no byte-compiling of torch's 18,000 modules, then the ones the tests
        # import compiled by importing them once (the nodes mount the venv read-only).
        subprocess.run([str(venv_dir / "bin/pip"), "install", "--quiet", "--no-compile", "--find-links",
                        LAB_TEST_WHEELS, LAB_TEST_TORCH], check=True, timeout=1200)
        subprocess.run([str(venv_dir / "bin/python"), "-c", "import torch, torch.distributed.run"],
                       check=True, timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
        (venv_dir / "complete").write_text(LAB_TEST_TORCH + "\n")
    return f"{lab_session.LAB_TEST_VENV_MOUNT}/bin/python"


# --- lab tests: time for the session's lab in whichever test comes first ------------------------------

# The first lab test waits in its setup for whatever of the session's lab is not ready yet: on a fresh
# machine the lab image, the bundle with Horovod's compile, the lab's start and its first converge, while
# `invoke test` runs the other tests beside them. A lab test without its own limit gets an hour.
LAB_TEST_TIMEOUT_S = 3600


@pytest.hookimpl(tryfirst=True)  # before -m and -k deselect: tests/test_tiers.py reads the whole suite
def pytest_collection_modifyitems(config, items):
    config.dtlab_collected_items = list(items)
    for item in items:
        if item.get_closest_marker("lab") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LAB_TEST_TIMEOUT_S))


# --- (next section) -----------------------------------------------------------------------------------


# --- provisioning: the test lab converged with site.yml, once per session -----------------------


@pytest.fixture(scope="session")
def provisioned_lab(lab):
    """(lab, first converge) after one full `ansible-playbook site.yml` on the test lab.

    The converge is a dtlab.provision.ConvergeResult; a failed converge fails the dependent tests.
    """
    from dtlab import provision

    result = lab_session.load_converge_result(lab.name) or provision.converge(lab.inventory_path)
    if not result.ok:
        pytest.fail(f"site.yml did not converge on the test lab: {result.summary()}\n{result.output[-4000:]}")
    return lab, result


# --- loopback clusters: one real Spark and one real Ray on 127.0.0.1, started once a session ----------
# The Spark launcher's tests and the Connect unit's wait share the Spark cluster, the Ray launcher's and the
# Ray probe's tests the Ray one (issue #50: each was started once per module). Each stops by PID after the
# last test that uses it (pytest_runtest_teardown): left up, an idle Ray used about 7 CPU-minutes during
# the lab's tests, which run last. The stop fails if anything of the cluster is left running.
LOOPBACK_CLUSTERS = ("loopback_spark", "loopback_ray")
_LOOPBACK_STOPS = {}  # fixture name -> its stop, until it ran


def _stop_after_last_user(name, stop):
    """`stop`, run once: after the last test that uses fixture `name`, or at the session's end."""
    done = []

    def once():
        if not done:
            done.append(True)
            stop()
    _LOOPBACK_STOPS[name] = once
    return once


def _stop_and_confirm_none_left(cluster, tree) -> None:
    import psutil

    cluster.stop()
    left = [process.pid for process in tree
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"{type(cluster).__name__}: processes left after stop(): {left}"


@pytest.fixture(scope="session")
def loopback_spark():
    """A standalone master and 2 workers of 1 core, with spark.authenticate (its `auth_secret`)."""
    import secrets

    import psutil

    from tests.sparkcluster import SparkStandaloneCluster

    with SparkStandaloneCluster(workers=2, cores_per_worker=1, auth_secret=secrets.token_hex(16)) as cluster:
        def stop():
            tree = [psutil.Process(pid) for pid in cluster.pids()]
            tree += [child for process in tree for child in process.children(recursive=True)]
            _stop_and_confirm_none_left(cluster, tree)
        stop_once = _stop_after_last_user("loopback_spark", stop)
        yield cluster
        stop_once()


@pytest.fixture(scope="session")
def loopback_ray():
    """A head with no CPUs and 2 worker raylets of 1 CPU, with token authentication."""
    import psutil

    from tests.raycluster import RayCluster

    with RayCluster(workers=2, cpus_per_worker=1) as cluster:
        def stop():
            tree = [*cluster.descendants(), *(psutil.Process(p.pid) for p in cluster.processes)]
            _stop_and_confirm_none_left(cluster, tree)
            assert not cluster.scratch.exists(), cluster.scratch
        stop_once = _stop_after_last_user("loopback_ray", stop)
        yield cluster
        stop_once()
