"""The builder of the apt part: every package the roles install, with its dependencies, resolved by
apt-get as for an empty node through this controller's sources and the roles' repositories, into a flat
repository (Packages, Release)."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from dtlab.bundle.external import APT_TIMEOUT_S, Say, _download, _run
from dtlab.bundle.manifest import Entry
from dtlab.bundle.planning import Plan
from dtlab.files import atomic_write_text

APT_SOURCE_PARTS = Path("/etc/apt/sources.list.d")  # this controller's own, which the resolver keeps


def _build_apt(the_plan: Plan, out: Path, say: Say) -> list[Entry]:
    """Every package and its dependencies, resolved as if the node had nothing installed (an empty dpkg
    status), with this machine's own apt sources and keys and the repositories the roles add
    (Plan.apt_sources, with their keys), into a flat repository."""
    repo = out / "apt"
    repo.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dtlab-bundle-apt-") as scratch:
        state = Path(scratch)
        (state / "lists/partial").mkdir(parents=True)
        (state / "archives/partial").mkdir(parents=True)
        (state / "status").write_text("")
        options = ["-o", f"Dir::State::Lists={state / 'lists'}",
                   "-o", f"Dir::State::status={state / 'status'}",
                   "-o", f"Dir::Cache::archives={state / 'archives'}", "-o", f"Dir::Cache={state}",
                   "-o", f"Dir::Etc::SourceParts={_source_parts(the_plan, state)}",
                   "-o", "APT::Install-Recommends=false", "-o", "Debug::NoLocking=true"]
        _run(["apt-get", *options, "-q", "update"], "apt-get update (the bundle's own lists)", APT_TIMEOUT_S)
        # Each package's URL, for the manifest: asked while the scratch cache is empty, so apt names them all.
        printed = _run(["apt-get", *options, "-qq", "--print-uris", "install", *the_plan.apt_packages],
                       "apt-get install --print-uris", APT_TIMEOUT_S).stdout
        # The bundle's packages go into the scratch cache first: a rebuild downloads only what changed.
        for deb in repo.glob("*.deb"):
            os.link(deb, state / "archives" / deb.name) if deb.stat().st_dev == state.stat().st_dev \
                else shutil.copy2(deb, state / "archives" / deb.name)
        _run(["apt-get", *options, "-q", "-y", "--download-only", "install", *the_plan.apt_packages],
             "apt-get install --download-only", APT_TIMEOUT_S)
        wanted = {deb.name for deb in (state / "archives").glob("*.deb")}
        for stale in repo.glob("*.deb"):
            if stale.name not in wanted:
                stale.unlink()
        for deb in (state / "archives").glob("*.deb"):
            if not (repo / deb.name).exists():
                shutil.move(str(deb), repo / deb.name)
    index = _run(["dpkg-scanpackages", "--multiversion", "."], "dpkg-scanpackages", 600, cwd=repo).stdout
    atomic_write_text(repo / "Packages", index)
    with gzip.open(repo / "Packages.gz", "wt") as compressed:
        compressed.write(index)
    atomic_write_text(repo / "Release", _release(repo, the_plan.node_os))
    entries = []
    for deb in sorted(repo.glob("*.deb")):
        name, version, _arch = (deb.stem.split("_") + ["", ""])[:3]
        entries.append(Entry(f"apt/{deb.name}", "apt", name, version.replace("%3a", ":"),
                             _package_uris(printed).get(deb.name, the_plan.node_os)))
    entries += [Entry(f"apt/{index_file}", "apt", index_file, "", "dpkg-scanpackages")
                for index_file in ("Packages", "Packages.gz", "Release")]
    named = ", ".join(the_plan.apt_packages)
    added = "".join(f" + {source['name']}'s repository" for source in the_plan.apt_sources)
    say(f"bundle: apt: {len(entries) - 3} packages: {named} and their dependencies"
        f" ({the_plan.node_os}{added})")
    return entries


def _source_parts(the_plan: Plan, state: Path) -> Path:
    """A sources.list.d for the resolver: this machine's own parts, and each repository the roles add, as a
    deb822 file signed by its key (fetched into the scratch directory when the role names it by URL)."""
    parts = state / "sources.list.d"
    parts.mkdir()
    for own in sorted(APT_SOURCE_PARTS.glob("*")):
        if own.suffix in (".list", ".sources"):
            shutil.copy2(own, parts / own.name)
    for source in the_plan.apt_sources:
        key = source["signed_by"]
        if re.match(r"[a-z]+://", key):
            fetched = state / "keys" / source["name"]
            _download(key, fetched, f"apt: the signing key of repository {source['name']}")
            # apt reads an armored key only by its .asc name, a binary one by .gpg
            armored = fetched.read_bytes().lstrip().startswith(b"-----")
            key_file = fetched.with_suffix(".asc" if armored else ".gpg")
            fetched.rename(key_file)
            key = str(key_file)
        fields = {"Types": source["types"], "URIs": source["uris"], "Suites": source["suites"],
                  "Components": source["components"], "Signed-By": [key] if key else []}
        (parts / f"dtlab-{source['name']}.sources").write_text(
            "".join(f"{name}: {' '.join(values)}\n" for name, values in fields.items() if values))
    return parts


def _package_uris(printed: str) -> dict[str, str]:
    """apt-get --print-uris's lines (`'URL' FILE SIZE HASH`) as {file name: URL}."""
    found = {}
    for line in printed.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].startswith("'") and fields[1].endswith(".deb"):
            found[fields[1]] = fields[0].strip("'")
    return found


def _release(repo: Path, node_os: str) -> str:
    """A flat repository's Release file: apt checks the indexes against it (the debs against the indexes)."""
    lines = ["Origin: dtlab bundle", f"Label: dtlab bundle for {node_os}", "Suite: dtlab-bundle",
             f"Date: {datetime.now(UTC).strftime('%a, %d %b %Y %H:%M:%S UTC')}", "SHA256:"]
    for index_file in ("Packages", "Packages.gz"):
        data = (repo / index_file).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {index_file}")
    return "\n".join(lines) + "\n"
