"""The test session's lab, prepared in the background while the tests that need no lab run.

A fresh machine spends minutes before the session's lab is ready for its tests: the offline bundle (its
wheels, Horovod's compile among them, and its apt packages), the lab's node image (mmdebstrap), then the
lab's start and its first converge. tests/conftest.py starts the two builds as processes of their own once
collection is done; when both have ended well it starts the third, which brings the lab up from the
bundle and (when a selected test needs it) converges site.yml on it. The lab tests run last, and the
`lab` fixture waits for all three: the tests that need no lab fill the cores meanwhile.

    python tests/lab_session.py image NAME               build (or find) the lab's node image
    python tests/lab_session.py bundle NAME              build (or complete) the test lab's offline bundle
    python tests/lab_session.py lab NAME [--converge]    the lab up from that bundle (then site.yml on it)
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository's packages, as pytest's pythonpath gives them
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtlab import paths  # noqa: E402

BUILD_STEPS = ("image", "bundle")  # independent of each other
LAB_STEP = "lab"  # after both
STEPS = (*BUILD_STEPS, LAB_STEP)
# A fresh 2-core machine took 6 minutes for the bundle (Horovod's compile 5 of them), under 2 for the
# image and 6.5 for the lab's first converge; an hour means something hangs.
PREPARE_TIMEOUT_S = 3600

# Keep the test lab's node state between sessions (faster reruns, e.g. while writing roles).
KEEP_TEST_LAB = os.environ.get("DTLAB_TEST_LAB_KEEP") == "1"
# Test-only torch for the nodes before provisioning exists: a venv of /usr/bin/python3 (the nodes'
# interpreter, Debian's 3.11), built on the controller (tests/conftest.py lab_torch_python) and
# bind-mounted read-only into the test lab.
LAB_TEST_VENV_MOUNT = "/opt/dtlab/testvenv"
# A lab that is already provisioned (e.g. inventory/lab-<yours>.yml) for the harness's lab tests, instead
# of the session's test lab (which is then neither converged nor needed by them).
EXISTING_LAB_INVENTORY = os.environ.get("DTLAB_HARNESS_TEST_INVENTORY")


def bundle_dir(name: str) -> Path:
    return paths.STATE_DIR / "bundles" / name


def log_path(name: str, step: str) -> Path:
    return paths.STATE_DIR / f"test-lab-{name}-{step}.log"


def converge_result_path(name: str) -> Path:
    """The lab step's first converge (a pickled dtlab.provision.ConvergeResult), for `provisioned_lab`."""
    return paths.STATE_DIR / f"test-lab-{name}-converge.pickle"


def lab_test_venv_dir() -> Path:
    return paths.STATE_DIR / "lab-testvenv"


def build_bundle(name: str) -> Path:
    """The test lab's offline bundle (dtlab.bundle, docs/offline.md), built or brought up to date; its plan
    comes from the default lab's inventory, which has the test lab's shape and group_vars."""
    from dtlab import bundle
    from dtlab.platforms import load_cluster

    cluster = load_cluster(paths.INVENTORY_DIR / "lab.yml")
    directory = bundle_dir(name)
    bundle.build(cluster, directory, say=print)
    return directory


def verify_bundle(name: str) -> list[str]:
    from dtlab import bundle
    from dtlab.platforms import load_cluster

    return bundle.verify(load_cluster(paths.INVENTORY_DIR / "lab.yml"), bundle_dir(name))


def build_image(name: str) -> Path:
    from dtlab.lab import host, image
    from dtlab.lab.config import load_config

    host.ensure_tools()
    return image.ensure_image(load_config(name))


def bring_up(name: str, converge: bool) -> int:
    """The offline test lab on fresh nodes (unless DTLAB_TEST_LAB_KEEP=1), and with `converge` one full
    site.yml on it. A failed converge is still a result (the tests that need it fail with its summary);
    a bundle that does not verify, or a lab that does not come up, is this step's failure."""
    import dtlab.lab
    from dtlab import provision

    result_path = converge_result_path(name)
    result_path.unlink(missing_ok=True)
    problems = verify_bundle(name)
    if problems:
        print("the test lab's offline bundle does not verify:", *problems, sep="\n")
        return 1
    if not KEEP_TEST_LAB:
        dtlab.lab.down(name, wipe=True)  # a crashed session's leftovers
    lab_test_venv_dir().mkdir(parents=True, exist_ok=True)  # filled on demand by lab_torch_python
    binds = {str(lab_test_venv_dir()): LAB_TEST_VENV_MOUNT}
    config = dtlab.lab.up(name, binds=binds, bundle=bundle_dir(name))
    print(f"lab {name}: up ({', '.join(config.node_names)})", flush=True)
    if converge:
        result = provision.converge(config.inventory_path, progress=lambda line: print(line, flush=True))
        print(f"converge: {result.summary()}")
        with result_path.open("wb") as out:
            pickle.dump(result, out)
    return 0


def load_converge_result(name: str):
    """The converge the lab step recorded (a dtlab.provision.ConvergeResult), or None."""
    path = converge_result_path(name)
    if not path.is_file():
        return None
    with path.open("rb") as recorded:
        return pickle.load(recorded)  # noqa: S301 (this session's own file, written by bring_up)


def main(argv: list[str]) -> int:
    usage = f"usage: python tests/lab_session.py {{{'|'.join(STEPS)}}} NAME [--converge]"
    if len(argv) not in (2, 3) or argv[0] not in STEPS or argv[2:] not in ([], ["--converge"]):
        print(usage, file=sys.stderr)
        return 2
    step, name = argv[:2]
    if step == LAB_STEP:
        return bring_up(name, converge="--converge" in argv)
    print(f"{step}: {build_image(name) if step == 'image' else build_bundle(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
