"""The test session's lab, prepared in the background while the tests that need no lab run.

A fresh machine spends minutes on two builds before the session's lab exists: the offline bundle (its
wheels, Horovod's compile among them, and its apt packages) and the lab's node image (debootstrap). Both
wait on the network and the disk as much as on the cores, and neither needs the other. tests/conftest.py
starts each as a process of its own once collection is done, runs the lab tests last, and the `lab`
fixture waits for both before it brings the lab up: the other tests fill the cores meanwhile.

    python tests/lab_session.py image NAME     build (or find) the lab's node image
    python tests/lab_session.py bundle NAME    build (or complete) the test lab's offline bundle
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: the repository's packages, as pytest's pythonpath gives them
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtlab import paths  # noqa: E402

STEPS = ("image", "bundle")
# A fresh 2-core machine took 6 minutes for the bundle (Horovod's compile 5 of them) and under 2 for the
# image; an hour means something hangs.
PREPARE_TIMEOUT_S = 3600


def bundle_dir(name: str) -> Path:
    return paths.STATE_DIR / "bundles" / name


def log_path(name: str, step: str) -> Path:
    return paths.STATE_DIR / f"test-lab-{name}-{step}.log"


def build_bundle(name: str) -> Path:
    """The test lab's offline bundle (dtlab.bundle, docs/offline.md), built or brought up to date; its plan
    comes from the default lab's inventory, which has the test lab's shape and group_vars."""
    from dtlab import bundle
    from dtlab.inventory import load_cluster

    cluster = load_cluster(paths.INVENTORY_DIR / "lab.yml")
    directory = bundle_dir(name)
    bundle.build(cluster, directory, say=print)
    return directory


def verify_bundle(name: str) -> list[str]:
    from dtlab import bundle
    from dtlab.inventory import load_cluster

    return bundle.verify(load_cluster(paths.INVENTORY_DIR / "lab.yml"), bundle_dir(name))


def build_image(name: str) -> Path:
    from dtlab.lab import host, image
    from dtlab.lab.config import load_config

    host.ensure_tools()
    return image.ensure_image(load_config(name))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in STEPS:
        print(f"usage: python tests/lab_session.py {{{'|'.join(STEPS)}}} NAME", file=sys.stderr)
        return 2
    step, name = argv
    print(f"{step}: {build_image(name) if step == 'image' else build_bundle(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
