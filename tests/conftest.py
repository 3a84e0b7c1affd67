"""Shared pytest fixtures. Each section belongs to one part of dtlab; add yours as its own section."""

import os
import subprocess

import pytest

# --- lab: one lab instance for the whole session (tests/lab/, provisioning, harness) ------------------

# Its own instance, so running the tests never touches a user's lab ("dtlab") or another engineer's.
TEST_LAB_NAME = os.environ.get("DTLAB_TEST_LAB_NAME", "dtlabtest")
# Keep the test lab's node state between sessions (faster reruns, e.g. while writing roles).
KEEP_TEST_LAB = os.environ.get("DTLAB_TEST_LAB_KEEP") == "1"
# Test-only torch for the nodes before provisioning exists: a venv of /usr/bin/python3 (the nodes'
# interpreter, Debian's 3.11), built on the controller and bind-mounted read-only into the test lab.
LAB_TEST_VENV_MOUNT = "/opt/dtlab/testvenv"
LAB_TEST_TORCH = "torch==2.13.0"
LAB_TEST_WHEELS = "/opt/wheels"


def _lab_test_venv_dir():
    from dtlab import paths

    return paths.STATE_DIR / "lab-testvenv"


@pytest.fixture(scope="session")
def lab():
    """The up test lab (a dtlab.lab.LabConfig): `lab.inventory_path`, `lab.node_names`, ...

    Fresh nodes each session (unless DTLAB_TEST_LAB_KEEP=1); always brought down at the end,
    also when a test or lab.up itself fails. Needs root.
    """
    import dtlab.lab

    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    _lab_test_venv_dir().mkdir(parents=True, exist_ok=True)  # filled on demand by lab_torch_python
    try:
        if not KEEP_TEST_LAB:
            dtlab.lab.down(TEST_LAB_NAME, wipe=True)  # a crashed session's leftovers
        yield dtlab.lab.up(TEST_LAB_NAME, binds={str(_lab_test_venv_dir()): LAB_TEST_VENV_MOUNT})
    finally:
        dtlab.lab.down(TEST_LAB_NAME, wipe=not KEEP_TEST_LAB)


@pytest.fixture(scope="session")
def lab_torch_python(lab):
    """Path, inside the test lab's nodes, of a python3 that has torch (built once, cached in .dtlab/)."""
    venv_dir = _lab_test_venv_dir()
    if not (venv_dir / "complete").exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(venv_dir)], check=True, timeout=300)
        subprocess.run([str(venv_dir / "bin/pip"), "install", "--quiet", "--find-links", LAB_TEST_WHEELS,
                        LAB_TEST_TORCH], check=True, timeout=1200)
        (venv_dir / "complete").write_text(LAB_TEST_TORCH + "\n")
    return f"{LAB_TEST_VENV_MOUNT}/bin/python"


# --- (next section) -----------------------------------------------------------------------------------
