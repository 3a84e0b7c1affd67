"""manifest.json: its format, `Entry` (one file of the bundle as it lists it), and writing, reading and
hashing those files."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from dtlab.bundle.external import CHUNK
from dtlab.bundle.planning import Plan
from dtlab.errors import DtlabError
from dtlab.files import atomic_write_text

BUNDLE_FORMAT = 1
MANIFEST = "manifest.json"


@dataclass
class Entry:
    """One file of the bundle, as manifest.json lists it."""

    path: str  # relative to the bundle
    part: str
    name: str
    version: str
    source: str
    sha256: str = ""
    bytes: int = 0


def write_manifest(out: Path, cluster_name: str, the_plan: Plan, entries: list[Entry]) -> None:
    """manifest.json for the files of `entries` (their sha256 and size taken now where not yet known)."""
    for entry in entries:
        if not entry.sha256:
            entry.sha256, entry.bytes = file_digest(out / entry.path), (out / entry.path).stat().st_size
    manifest = {
        "format": BUNDLE_FORMAT,
        "built": datetime.now(UTC).isoformat(timespec="seconds"),
        "cluster": cluster_name,
        "node_os": the_plan.node_os,
        "node_python": the_plan.node_python,
        "torch_build": the_plan.torch_build,
        "node_kernel": the_plan.node_kernel,
        "plan": asdict(the_plan),
        "files": [asdict(e) for e in sorted(entries, key=lambda e: e.path)],
    }
    atomic_write_text(out / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(bundle: Path) -> list[Entry]:
    path = bundle / MANIFEST
    try:
        data = json.loads(path.read_text())
        return [Entry(**item) for item in data["files"]]
    except FileNotFoundError:
        raise DtlabError(
            f"bundle {bundle}: no {MANIFEST}; build one: invoke bundle.build --out {bundle}") from None
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise DtlabError(f"bundle {bundle}: {MANIFEST} is not a dtlab manifest ({error})") from None
