"""The Determined trial image: its name lives in one place (determined_trial_image), goes into every
experiment dtlab submits and into master.yaml's defaults; and the check refuses, in one line, an image
whose python3 cannot install the pins. Here the probe runs with real interpreters and real pip (the
controller's venv, fresh venvs with and without pip); Docker's part is the lab's
(tests/harness/test_trial_image_lab.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, write_inventory

from dtlab import pins
from dtlab.cell import Cell
from dtlab.launch import CellPaths, place, trainer_config
from dtlab.platforms import determined, load_cluster
from dtlab.platforms.determined import config as detconfig

IMAGE = "registry.example/trial:1"
LINE_START = f"determined: trial image {IMAGE} on node1 cannot install the pins: "
DIRECT = ("torch", "transformers", "numpy")


def _markers(python: str) -> dict[str, str]:
    """The marker environment of an image whose python3 is `python` (otherwise this machine's)."""
    import platform

    return {
        "implementation_name": "cpython",
        "implementation_version": python,
        "os_name": "posix",
        "platform_machine": platform.machine(),
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": python,
        "python_version": ".".join(python.split(".")[:2]),
        "sys_platform": "linux",
    }


def probe_answer(python="3.11.2", installed=None, pip="23.0.1", dry_run_exit=1, errors=()) -> str:
    """trial_image_probe.py's JSON line, as an image with these traits prints it."""
    return json.dumps(
        {
            "python": python,
            "markers": _markers(python),
            "installed": installed or {"pip": pip},
            "pip": pip,
            "pip_dry_run": {"exit": dry_run_exit, "errors": list(errors)} if pip else None,
        }
    )


def verdict(stdout: str, exit_code: int = 0, stderr: str = "") -> detconfig.TrialImageVerdict:
    return detconfig.trial_image_verdict("node1", IMAGE, exit_code, stdout, stderr)


def every_pin_but(python: str, **versions: str) -> dict[str, str]:
    """The image has every pin of the startup hook's closure, except these names at these versions."""
    closure = detconfig._pin_closure(_markers(python))
    return {**closure, **versions}


def assert_one_refusal_line(found: detconfig.TrialImageVerdict, *parts: str) -> None:
    assert not found.ok
    assert "\n" not in found.detail
    assert found.detail.startswith(LINE_START), found.detail
    assert found.detail.endswith(f"({detconfig.TRIAL_IMAGE_DOCS})"), found.detail
    for part in parts:
        assert part in found.detail, found.detail


# --- one place for the image's name --------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path):
    return load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS}))


def rendered(cluster) -> dict:
    cell = Cell("determined", 2, 1, 1)
    placement = place(cluster, cell)
    config = trainer_config(cluster, placement, CellPaths(cluster, cell, 1), determined.CLUSTER_LABEL)
    return determined.render_experiment(cluster, cell, config)


def test_every_submitted_experiment_runs_in_the_trainer_image_by_default(cluster):
    environment = rendered(cluster)["environment"]
    assert environment["image"] == "dtlab-trainer:latest" == determined.trial_image(cluster)
    assert environment["force_pull_image"] is False  # the agent runs the image its Docker has


def test_the_inventory_chooses_the_trial_image_in_one_place(tmp_path):
    site = CPU_SITE_VARS + f"determined_trial_image: {IMAGE}\n"
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site}))
    assert rendered(cluster)["environment"]["image"] == IMAGE


def test_the_experiment_templates_name_no_image_of_their_own():
    for path in detconfig.experiment_configs():
        assert "image" not in (detconfig.load_experiment(path).get("environment") or {}), path


# --- the verdict, from the probe's answer ------------------------------------------------------------


def test_python_310_is_refused_naming_the_pin_that_needs_311():
    installed = every_pin_but("3.10.12", numpy="1.26.4")  # all there but numpy, which must be upgraded
    found = verdict(
        probe_answer(
            "3.10.12", installed=installed, errors=["ERROR: No matching distribution found for numpy==2.4.6"]
        )
    )
    assert_one_refusal_line(
        found,
        f"numpy=={pins.pinned('numpy')} needs Python >=3.11",
        "the image has 3.10.12",
        "set determined_trial_image (inventory/group_vars/all.yml)",
    )
    assert "so do" not in found.detail  # numpy alone is missing


def test_python_310_with_nothing_installed_names_a_requirement_first_and_counts_the_rest():
    found = verdict(probe_answer("3.10.12", errors=["ERROR: No matching distribution found for torch"]))
    assert_one_refusal_line(found, "needs Python >=3.11", "so do", "more), the image has 3.10.12")
    first_pin = found.detail.removeprefix(LINE_START).split("==")[0]
    assert first_pin in {"filelock", "transformers"}  # the hook's own requirements come first


def test_an_image_with_every_pin_passes_and_has_nothing_to_fetch():
    found = verdict(
        probe_answer("3.11.9", installed=every_pin_but("3.11.9", torch="2.13.0+cu126"), dry_run_exit=0)
    )
    assert found.ok and "every pin installed, startup-hook.sh has nothing to fetch" in found.detail


def test_a_cuda_build_of_the_pinned_torch_counts_as_the_pin():
    installed = every_pin_but("3.10.12", torch=f"{pins.pinned('torch')}+cu126", numpy="1.26.4")
    found = verdict(probe_answer("3.10.12", installed=installed))
    assert "so do" not in found.detail and "numpy==" in found.detail  # torch is not named


def test_a_newer_python_without_the_pins_passes_and_says_what_the_hook_will_install():
    found = verdict(probe_answer("3.12.3", errors=["ERROR: No matching distribution found for torch"]))
    assert found.ok
    assert "python 3.12.3, pip 23.0.1: startup-hook.sh installs" in found.detail
    assert "at each trial start" in found.detail


@pytest.mark.parametrize(
    ("answer", "exit_code", "stderr", "says"),
    [
        ("", detconfig.PROBE_MISSING_IMAGE_EXIT, "no image", "Docker there has no such image"),
        (
            "",
            125,
            "docker: Error response from daemon: failed to create shim task: operation not permitted",
            "Docker there cannot run it (exit 125: docker: Error response from daemon: failed to create shim",
        ),
        ('{"python": null}', 0, "", "it has no python3"),
        (probe_answer(pip=None), 0, "", "its python3 3.11.2 has no pip"),
        (
            probe_answer(
                errors=["error: externally-managed-environment", "× This environment is externally managed"]
            ),
            0,
            "",
            "its python3 3.11.2 is externally managed (PEP 668)",
        ),
        (
            probe_answer(installed=every_pin_but("3.11.2"), errors=["ERROR: pip's own failure"]),
            0,
            "",
            "pip's dry run of startup-hook.sh fails: ERROR: pip's own failure",
        ),
    ],
)
def test_each_way_an_image_fails_is_one_line_that_says_why(answer, exit_code, stderr, says):
    assert_one_refusal_line(verdict(answer, exit_code, stderr), says)


# --- the probe itself, with real interpreters and pip (no Docker) -----------------------------------


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("probe")
    for name, text in detconfig.trial_image_probe_files().items():
        (directory / name).write_text(text)
    return directory


def run_probe(python: str, probe_dir: Path) -> detconfig.TrialImageVerdict:
    done = subprocess.run(
        [python, str(probe_dir / detconfig.TRIAL_IMAGE_PROBE.name)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    return detconfig.trial_image_verdict("node1", IMAGE, done.returncode, done.stdout, done.stderr)


def test_the_controllers_venv_holds_every_pin_so_pip_has_nothing_to_fetch_offline(probe_dir):
    found = run_probe(sys.executable, probe_dir)  # constraints.txt is this venv's freeze
    assert found.ok and "nothing to fetch" in found.detail, found.detail


@pytest.mark.slow
def test_a_bare_python_with_pip_would_install_the_pins_and_one_without_pip_is_refused(probe_dir, tmp_path):
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", str(tmp_path / "bare")], check=True, timeout=180)
    subprocess.run(
        [str(base), "-m", "venv", "--without-pip", str(tmp_path / "nopip")], check=True, timeout=60
    )
    with_pip = run_probe(str(tmp_path / "bare" / "bin" / "python"), probe_dir)
    assert with_pip.ok and "pin(s) at each trial start" in with_pip.detail, with_pip.detail
    assert_one_refusal_line(run_probe(str(tmp_path / "nopip" / "bin" / "python"), probe_dir), "has no pip")


# --- where the check runs -----------------------------------------------------------------------------


def test_without_determined_each_worker_gets_a_note_not_a_failure(tmp_path):
    site = CPU_SITE_VARS + "determined_install_binaries: false\n"  # as on the lab
    cluster = load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site}))
    states = {node.name: {} for node in cluster.nodes}  # every node answered the probe
    rows = [row for row in determined.PLATFORM.check_rows(cluster, states)
            if row.check == "determined trial image"]
    assert [row.node for row in rows] == [worker.name for worker in cluster.workers]
    assert all(row.ok and not row.required and row.detail == "Determined not installed here" for row in rows)


def test_the_probe_command_runs_the_image_offline_and_never_pulls():
    command = determined.trial_image_probe_command(IMAGE, "/opt/dtlab/torch-build/requirements.txt")
    assert f"docker image inspect {IMAGE} " in command
    assert f"exit {detconfig.PROBE_MISSING_IMAGE_EXIT}" in command
    assert "docker run --rm --pull never --network none" in command
    assert "-v /opt/dtlab/torch-build:/opt/dtlab/torch-build:ro" in command
