"""Bad flags, matrices and inventories fail with one clear line and exit 2, before anything starts."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness_helpers import INVOKE, invoke, write_inventory

from dtlab import paths, platforms
from dtlab.results import Provenance


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--profile", "nope"], "no profile 'nope'; choose one of study, smoke"),
        (["--only", "mpi"], "--only 'mpi': matches no cell of profile smoke"),
        (["--retries", "-1"], "--retries -1: must be >= 0"),
        (["--timeout", "soon"], "must be whole numbers"),
    ],
)
def test_bad_bench_flags_fail_with_one_line_before_any_node_is_contacted(
    loopback_inventory, tmp_path, args, expected
):
    answer = invoke(
        "bench.all", "-i", str(loopback_inventory), *args, env={"DTLAB_RESULTS_DIR": str(tmp_path / "r")}
    )
    assert answer.returncode == 2, answer.stderr
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in answer.stderr
    assert not (tmp_path / "r").exists()  # nothing started, nothing recorded


def test_bench_faults_refuses_a_profile_without_a_fault_plan_and_a_node_the_cell_does_not_use(
    loopback_inventory, tmp_path
):
    env = {"DTLAB_RESULTS_DIR": str(tmp_path / "r")}
    plain = invoke("bench.faults", "-i", str(loopback_inventory), "--profile", "smoke", env=env)
    assert plain.returncode == 2 and len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    assert "bench.faults: profile smoke in " in plain.stderr and "has no fault plan" in plain.stderr
    elsewhere = tmp_path / "matrix.yml"
    elsewhere.write_text("profiles:\n  f:\n    fault: {kind: kill, after_epoch: 1, node: n0}\n"
                         "    runs: [{frameworks: ddp, gpus: 2, epochs: 2, seeds: 0}]\n")
    answer = invoke("bench.faults", "-i", str(loopback_inventory), "--matrix", str(elsewhere),
                    "--profile", "f", env=env)
    assert answer.returncode == 2 and answer.stderr.strip() == (
        "error: fault plan of ddp-g2-e2-s0-kill-after1-n0: node n0 is not among the workers the cell runs "
        "on (n1, n2); name one of them")
    assert not (tmp_path / "r").exists()  # nothing started, nothing recorded


def test_bench_run_of_an_unknown_cell_names_the_cells_there_are(loopback_inventory):
    answer = invoke("bench.run", "ddp-g9-e2-s0", "-i", str(loopback_inventory))
    assert answer.returncode == 2
    expected = "error: bench.run ddp-g9-e2-s0: no such cell in profile smoke; cells: ddp-g1-e2-s0"
    assert answer.stderr.startswith(expected)
    assert len(answer.stderr.strip().splitlines()) == 1


def test_a_bad_matrix_file_fails_with_one_line(loopback_inventory, tmp_path):
    bad = tmp_path / "matrix.yml"
    bad.write_text(
        "profiles:\n  smoke:\n    runs: [{frameworks: [ddp, mpi], gpus: 1, epochs: 1, seeds: 0}]\n"
    )
    answer = invoke("bench.all", "-i", str(loopback_inventory), "--matrix", str(bad))
    assert answer.returncode == 2
    assert answer.stderr.strip() == (
        f"error: {bad}: profiles.smoke.runs[0].frameworks[1]: "
        "must be one of ddp, determined, horovod, ray, slurm, spark; got 'mpi'"
    )


def test_more_gpus_than_the_inventory_has_fails_with_one_line(tmp_path):
    one_worker = write_inventory(
        tmp_path,
        "all:\n  children:\n    master: {hosts: {m: {ansible_host: 127.0.66.1}}}\n"
        "    workers: {hosts: {w: {ansible_host: 127.0.66.2}}}\n",
        group_vars={"all": "dtlab_device: cpu\n"},
    )
    answer = invoke("bench.all", "-i", str(one_worker))
    assert answer.returncode == 2
    assert (
        "gpus: 2 GPUs but the inventory offers 1" in answer.stderr
        and len(answer.stderr.strip().splitlines()) == 1
    )


@pytest.mark.parametrize("task", ["bench.all", "cluster.check", "cluster.reset", "trainer.deploy"])
def test_a_bad_inventory_fails_with_one_line(tmp_path, task):
    two_masters = write_inventory(
        tmp_path,
        "all:\n  children:\n    master: {hosts: {a: {ansible_host: 127.0.66.1}, "
        "b: {ansible_host: 127.0.66.3}}}\n    workers: {hosts: {w: {ansible_host: 127.0.66.2}}}\n",
    )
    answer = invoke(task, "-i", str(two_masters))
    assert answer.returncode == 2
    assert answer.stderr.strip() == (
        f"error: inventory {two_masters}: group 'master' has 2 hosts (a, b);"
        " keep exactly one host under master"
    )


def test_an_unreachable_node_is_reported_by_preflight_before_the_cell_starts(loopback_inventory, tmp_path):
    results = tmp_path / "results"
    answer = invoke(
        "bench.all",
        "-i",
        str(loopback_inventory),
        "--only",
        "ddp-g1",
        "--no-report",
        "--skip-gate",  # the health gate would refuse these nodes first (tests/harness/test_doctor.py)
        env={"DTLAB_RESULTS_DIR": str(results)},
    )
    assert answer.returncode == 1, answer.stderr
    assert "preflight: host n1 (127.0.66.11): ssh failed" in answer.stdout
    assert "health gate" not in answer.stdout + answer.stderr  # --skip-gate: no gate, no re-check, no drain
    [gate] = (results / "three" / paths.GATE_DIRNAME).glob("gate-*.json")  # the report says it was skipped
    gate_file = json.loads(gate.read_text())
    assert gate_file["status"] == "skipped" and gate_file["matrix"]["cells"] == ["ddp-g1-e2-s0"]
    from dtlab.results import ResultStore

    [failure] = ResultStore(results / "three").runs(status="failed")
    assert failure.cell_key == "ddp-g1-e2-s0" and failure.failed_node == "n1"
    assert failure.reason.startswith("preflight:")
    assert failure.attempt == 1  # a preflight failure is not retried: nothing was started


def test_bench_run_refuses_nodes_that_do_not_answer_before_reserving_an_attempt(loopback_inventory, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    answer = invoke("bench.run", "ddp-g1-e2-s0", "-i", str(loopback_inventory),
                    env={"DTLAB_RESULTS_DIR": str(results)})
    assert answer.returncode == 1, answer.stdout[-2000:] + answer.stderr
    lines = answer.stderr.strip().splitlines()
    assert lines[0].startswith("error: health gate: 3 check(s) failed on three: "), lines
    assert [line.split(": ")[2:4] for line in lines[1:]] == [[node, "ssh"] for node in ("n0", "n1", "n2")]
    assert "Traceback" not in answer.stdout + answer.stderr
    assert list(results.rglob("*")) == []  # no attempt reserved, no failure row, no store


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount in a mount namespace needs root")
def test_a_read_only_results_folder_is_said_before_any_node_is_asked(loopback_inventory, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    # The folder read-only for the command alone: bind-mounted over itself in a private mount namespace.
    script = (f"mount --bind -o ro {results} {results} && "
              f"exec {INVOKE} bench.all -i {loopback_inventory} --no-report")
    answer = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            capture_output=True, text=True, timeout=300, cwd=paths.REPO_ROOT,
                            env={**os.environ, "DTLAB_RESULTS_DIR": str(results)})
    assert answer.returncode == 2, answer.stdout[-2000:] + answer.stderr
    assert answer.stderr.strip().splitlines() == [
        f"error: results store {results / 'three'}: cannot be written ({results} is read-only for this "
        "user); make it writable, or give DTLAB_RESULTS_DIR, then run again (nothing was recorded)"]
    assert "health gate" not in answer.stdout + answer.stderr  # no node was asked
    assert list(results.iterdir()) == []


def test_a_bad_trainer_option_stops_the_matrix_before_any_attempt(loopback_inventory, tmp_path):
    bad = tmp_path / "matrix.yml"
    bad.write_text("profiles:\n  smoke:\n    trainer: {batch_size: 0}\n"
                   "    runs: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0}]\n")
    answer = invoke("bench.all", "-i", str(loopback_inventory), "--matrix", str(bad),
                    env={"DTLAB_RESULTS_DIR": str(tmp_path / "r")})
    assert answer.returncode == 2
    assert answer.stderr.strip() == (
        f"error: {bad}: profiles.smoke.trainer.batch_size: must be an integer >= 1, got 0")
    assert not (tmp_path / "r").exists(), "no attempt reserved, nothing recorded, no report"


def _not_a_database(db):
    db.write_bytes(b"these are somebody's notes, not SQLite\n" * 100)


def _other_schema(db):
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY)")
        conn.execute("PRAGMA user_version=99")


def _read_only(db):
    from result_factory import made_up_result

    from dtlab.cell import Cell
    from dtlab.results import ResultStore

    result = made_up_result("ddp", 1, 2, 0, time_total_s=30.0, final_accuracy=0.9, device="cpu")
    ResultStore(db.parent).record_ok(
        Cell("ddp", 1, 2, 0, "smoke"),
        result,
        Provenance(config_hash="0123456789abcdef", git_rev=None, inventory="three"),
    )


def tree(directory: Path) -> dict[str, bytes | None]:
    """Every path under directory (folders as None) with its bytes."""
    return {str(path.relative_to(directory)): None if path.is_dir() else path.read_bytes()
            for path in sorted(directory.rglob("*"))}


@pytest.mark.parametrize(
    ("make", "read_only_mount", "expected"),
    [
        (_not_a_database, False, "not a usable dtlab results database (not a SQLite database); move it"),
        (_other_schema, False, "schema version 99, this dtlab reads versions 1 to 6; use the dtlab revision"),
        (_read_only, True, "cannot be written ("),
    ],
    ids=["corrupt", "other-schema", "read-only"],
)
def test_an_unusable_results_store_is_one_line_and_stays_byte_identical(
    loopback_inventory, tmp_path, make, read_only_mount, expected
):
    store_dir = tmp_path / "r" / "three"
    store_dir.mkdir(parents=True)
    db = store_dir / "dtlab.sqlite"
    make(db)
    before = tree(store_dir)
    # The read-only store holds a recorded run: its runs/ folder is checked too, file by file.
    assert any(name.startswith("runs/") for name in before) == (make is _read_only)
    command = [INVOKE, "bench.all", "-i", str(loopback_inventory), "--only", "ddp-g1"]
    # Every unusable store, one that cannot take writes too, is refused before the health gate asks a node
    # (test_a_read_only_results_folder_is_said_before_any_node_is_asked); --skip-gate changes nothing here.
    command += ["--skip-gate"] if read_only_mount else []
    if read_only_mount:  # a real read-only mount (root ignores file modes), in a private mount namespace
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"',
                   str(store_dir), *command]
    answer = subprocess.run(command, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "DTLAB_RESULTS_DIR": str(tmp_path / "r")})
    assert answer.returncode == 2, answer.stderr + answer.stdout
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: results store {db}: ") and expected in lines[0]
    assert "Traceback" not in answer.stdout + answer.stderr
    assert tree(store_dir) == before, "nothing written, no attempt reserved"
    if make is not _read_only:  # bench.report reads the same store: the same line, no traceback
        report = invoke("bench.report", "--results-dir", str(store_dir))
        assert report.returncode == 2 and report.stderr.strip() == lines[0]


def test_cluster_reset_with_no_node_answering_says_each_once_in_one_line_and_resets_nothing(
    loopback_inventory,
):
    started = time.monotonic()
    answer = invoke("cluster.reset", "-i", str(loopback_inventory))
    assert answer.returncode == 1 and time.monotonic() - started < 60
    total = len(platforms.ALL) + 3
    lines = answer.stdout.splitlines()
    assert lines[0] == f"1/{total} stopping dtlab units and containers on every node"
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["n0", "n1", "n2"], answer.stdout
    assert all("does not answer" in line and "Unable to connect" in line for line in lines[1:])
    assert answer.stderr.strip() == "error: cluster.reset: no node answers (n0, n1, n2); nothing was reset"


def test_the_whole_suite_keeps_its_temporary_files_where_a_quick_run_beside_it_cannot_delete_them(
    tmp_path, monkeypatch
):
    from invoke import Config, Context

    from dtlab import commands

    # A one-test suite standing in for the whole one: it writes where pytest put its tmp_path.
    (tmp_path / "test_where.py").write_text(
        "def test_where(tmp_path):\n"
        f"    open({str(tmp_path / 'where.txt')!r}, 'w').write(str(tmp_path))\n")
    full_suite_temp = tmp_path / "pytest-full"
    monkeypatch.setattr(commands, "FULL_SUITE_BASETEMP", full_suite_temp)
    # tasks.py's PATH, as `invoke test` runs: this interpreter's pytest first, not another on PATH.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    quiet = Context(Config(overrides={"run": {"in_stream": False, "hide": True}}))
    passed = commands.run_tests(quiet, lint=False, tier="default",
                                pytest_args=f"-q -p no:cacheprovider {tmp_path / 'test_where.py'}")
    assert passed
    assert Path((tmp_path / "where.txt").read_text()).is_relative_to(full_suite_temp)


def test_fast_skips_ansible_lint_only_while_the_files_it_passed_on_are_unchanged(tmp_path, monkeypatch):
    from invoke import Config, Context

    from dtlab import commands, paths

    # A checkout of its own: a role ansible-lint reads, a test file it excludes, an ignored file.
    repo = tmp_path / "repo"
    (repo / "roles/r/tasks").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / ".ansible-lint").write_text("exclude_paths:\n  - tests/\n")
    (repo / ".gitignore").write_text("scratch/\n")
    (repo / "roles/r/tasks/main.yml").write_text("---\n- name: One\n  ansible.builtin.debug:\n")
    (repo / "tests/test_one.py").write_text("def test_one():\n    assert True\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=60)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True, timeout=60)
    ran = tmp_path / "ansible-lint-ran"
    monkeypatch.setattr(paths, "REPO_ROOT", repo)
    monkeypatch.setattr(commands, "ANSIBLE_LINT_CONFIG", repo / ".ansible-lint")
    monkeypatch.setattr(commands, "ANSIBLE_LINT_PASSED", tmp_path / "state" / "ansible-lint.passed")
    monkeypatch.setattr(commands, "ANSIBLE_LINT", f"touch {ran}")  # stands in for the minute-long linter
    monkeypatch.setattr(commands, "LINTERS", ("true", commands.ANSIBLE_LINT))
    stand_in_bin = tmp_path / "bin"  # pytest itself is not what is tested: a stand-in that passes
    stand_in_bin.mkdir()
    (stand_in_bin / "pytest").write_text("#!/bin/sh\nexit 0\n")
    (stand_in_bin / "pytest").chmod(0o755)
    monkeypatch.setenv("PATH", f"{stand_in_bin}:{os.environ['PATH']}")
    quiet = Context(Config(overrides={"run": {"in_stream": False, "hide": True}}))

    def fast_run_lints() -> bool:
        ran.unlink(missing_ok=True)
        assert commands.run_tests(quiet, lint=True, tier="fast", pytest_args="")
        return ran.exists()

    assert fast_run_lints(), "no pass kept yet"
    assert not fast_run_lints(), "the same files passed before"
    (repo / "tests/test_one.py").write_text("def test_one():\n    assert 1\n")
    (repo / "scratch").mkdir()
    (repo / "scratch/notes.yml").write_text("x: 1\n")
    (repo / "roles/r/README.md").write_text("# r\n")
    assert not fast_run_lints(), "an excluded file, an ignored one and Markdown are not ansible-lint's"
    (repo / "roles/r/tasks/extra.yml").write_text("---\n")
    assert fast_run_lints(), "a new, untracked role file is read"
    ran.unlink()
    assert commands.run_tests(quiet, lint=True, tier="default", pytest_args="")
    assert ran.exists(), "the whole suite always lints"


def test_a_task_that_draws_nothing_does_not_import_matplotlib():
    # matplotlib takes most of an `invoke` task's start-up (0.8 of 1.3 s); only drawing a figure needs it.
    probe = "import sys, dtlab.commands; print('matplotlib' in sys.modules)"
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            check=True)
    assert answer.stdout.strip() == "False"
