"""The trainer environment's fingerprint: the one definition that the trainer role, trainer.deploy and
cluster.check compare across nodes, and that every recorded run keeps per node (node_versions).

Run by the venv's own Python as `python -c <this file's text>`, by the role (roles/trainer/tasks/
fingerprint.yml) and by the harness over SSH (dtlab.probes.node_versions) alike; it prints one JSON line:
the Python version, the versions of the key packages, and freeze_sha, a hash of every installed
distribution's name==version. Standard library only: the role runs it before any trainer code is on
the node. Only the venv's own site-packages count, never the working directory or PYTHONPATH, so where
and how it is started does not change the answer.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import sysconfig

# The packages whose versions are shown and recorded by name (the whole freeze is hashed as well).
KEY_PACKAGES = ("torch", "transformers", "tokenizers", "datasets", "pyspark", "determined", "ray", "numpy")


def installed() -> list[str]:
    """Sorted name==version (name lower-case) of every distribution in this interpreter's site-packages."""
    site_packages = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    return sorted(
        {
            f"{dist.metadata['Name'].lower()}=={dist.version}"
            for dist in importlib.metadata.distributions(path=site_packages)
            if dist.metadata["Name"]  # a half-removed package can leave metadata without a name
        }
    )


def fingerprint() -> dict[str, str | None]:
    dists = installed()
    versions = dict(line.split("==", 1) for line in dists)
    return {
        "python": platform.python_version(),
        **{name: versions.get(name) for name in KEY_PACKAGES},
        "freeze_sha": hashlib.sha256("\n".join(dists).encode()).hexdigest()[:16],
    }


if __name__ == "__main__":
    print(json.dumps(fingerprint()))
