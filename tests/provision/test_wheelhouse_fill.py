"""The demo's early fill of the trainer role's wheelhouse (dtlab.provision.start_wheelhouse_fill): it holds
the lock the role waits on, and fills the wheelhouse the role reads first."""

import fcntl
import time

import yaml

from dtlab import paths, provision
from dtlab.platforms import load_cluster


def test_the_trainer_role_waits_on_the_lock_the_early_fill_holds():
    tasks = yaml.safe_load((paths.REPO_ROOT / "roles/trainer/tasks/wheelhouse.yml").read_text())
    wait = next(task for task in tasks if task["name"].startswith("Wait on a fill"))
    argv = wait["ansible.builtin.command"]["argv"]
    assert argv[0] == "flock" and argv[-2].endswith("}}/" + provision.WHEELHOUSE_FILL_LOCK), argv
    commands = [task["ansible.builtin.command"]["argv"] for task in tasks if "block" in task
                for task in task["block"] if "ansible.builtin.command" in task]
    fills = [argv for argv in commands if "pip" in argv]
    assert len(fills) == 2 and all("--find-links" in argv for argv in fills), fills  # the wheelhouse first


def test_the_early_fill_waits_for_a_fill_under_way_then_runs_pip_on_the_nodes_packages(tmp_path, monkeypatch):
    cluster = load_cluster(paths.INVENTORY_DIR / "lab.yml")
    monkeypatch.setattr(paths, "WHEELHOUSE_DIR", tmp_path / "wheelhouse")
    (tmp_path / "empty").mkdir()
    # Offline and nothing to find: once pip runs, it stops at the first package and names it.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    (tmp_path / "wheelhouse").mkdir()
    log = tmp_path / "fill.log"
    with open(tmp_path / "wheelhouse" / provision.WHEELHOUSE_FILL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a fill under way
        fill = provision.start_wheelhouse_fill(cluster, log)
        try:
            time.sleep(2)
            assert fill.poll() is None, log.read_text()  # waiting on the lock
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        assert fill.wait(timeout=120) != 0
    requested = log.with_suffix(".requirements.txt").read_text().split()
    assert "transformers" in requested and "torch" not in requested  # torch's build is the role's choice
    assert "transformers" in log.read_text()


def test_no_early_fill_where_the_nodes_install_from_an_index(tmp_path):
    cluster = load_cluster(paths.INVENTORY_DIR / "lab.yml")
    cluster.master.hostvars["trainer_install_source"] = "index"  # the master's view is the cluster's
    assert provision.start_wheelhouse_fill(cluster, tmp_path / "fill.log") is None
