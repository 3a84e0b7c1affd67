"""The node image: Debian via mmdebstrap, built once per recipe and cached read-only.

mmdebstrap, not debootstrap: it resolves and downloads through apt (in parallel, debootstrap fetches
one package after another), installs the base and the heavy packages in one pass, from the suite and its
-updates and -security together, and keeps services from starting in the chroot itself. The same recipe
took 37-48 s alone where debootstrap and a chroot apt-get took 72 s, with a third less CPU
(benchmarks/README.md, "Commands 1 and 2")."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from dtlab.errors import DtlabError
from dtlab.lab import host, mounts
from dtlab.lab.config import IMAGE_CACHE_DIR, LabConfig
from dtlab.lab.state import held_lock

# Bump when the build steps below change, so cached images built the old way are not reused.
IMAGE_RECIPE_VERSION = 2  # 2: mmdebstrap, base and extra packages in one pass
BUILD_TIMEOUT_S = 900
LOCK_WAIT_S = 1200
COMPLETE_MARKER = "complete"


def image_key(config: LabConfig) -> str:
    architecture = host.run(["dpkg", "--print-architecture"]).stdout.strip()
    recipe = {
        "recipe": IMAGE_RECIPE_VERSION,
        "suite": config.image_suite,
        "architecture": architecture,
        "base": sorted(config.image_base_packages),
        "extra": sorted(config.image_extra_packages),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def cached_image(config: LabConfig) -> Path | None:
    image_dir = IMAGE_CACHE_DIR / image_key(config)
    return image_dir / "rootfs" if (image_dir / COMPLETE_MARKER).exists() else None


def ensure_image(config: LabConfig) -> Path:
    """The image's root directory; builds it first (minutes) if the cache has none for this recipe."""
    rootfs = cached_image(config)
    if rootfs:
        return rootfs
    IMAGE_CACHE_DIR.mkdir(parents=True, exist_ok=True)
    key = image_key(config)
    # One builder per recipe across processes: parallel labs share the cache.
    with held_lock(IMAGE_CACHE_DIR / f".{key}.lock", LOCK_WAIT_S,
                   "lab: another process is building the node image; wait for it or end it"):
        rootfs = cached_image(config)  # another process may have built it while we waited
        if rootfs:
            return rootfs
        host.require_free_disk(IMAGE_CACHE_DIR, host.MIN_FREE_BYTES_BUILD)
        return _build(config, key)


def _build(config: LabConfig, key: str) -> Path:
    mirror = host.debian_mirror(config.image_suite)
    if not _node_sources(config):  # mmdebstrap would fall back to a default mirror of its own
        raise DtlabError(f"lab: no plain-http `deb` source for {config.image_suite} in /etc/apt/sources*: the"
                         " image and the nodes' apt proxy need one (http://, not https://)")
    _require_mirror(mirror)
    for stale in IMAGE_CACHE_DIR.glob(f".build-{key}-*"):  # left by a killed build; we hold the lock
        mounts.remove_tree(stale)
    build_dir = IMAGE_CACHE_DIR / f".build-{key}-{os.getpid()}"
    rootfs = build_dir / "rootfs"
    build_dir.mkdir()
    log_path = build_dir / "build.log"
    started = time.monotonic()
    print(f"lab: building the node image from {mirror.uri} (once; a minute or two), log {log_path}")
    try:
        _bootstrap(config, rootfs, log_path)
        _write_apt_sources(config, rootfs)
        _make_node_neutral(rootfs)
    except BaseException:
        mounts.unmount_under(build_dir)
        raise
    (build_dir / COMPLETE_MARKER).write_text(f"built in {time.monotonic() - started:.0f} s\n")
    final_dir = IMAGE_CACHE_DIR / key
    os.rename(build_dir, final_dir)  # atomic: a half-built image is never visible under its key
    print(f"lab: node image ready in {time.monotonic() - started:.0f} s: {final_dir}")
    return final_dir / "rootfs"


def _require_mirror(mirror: host.AptSource) -> None:
    release_url = f"{mirror.uri}/dists/{mirror.suite}/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(release_url, method="HEAD"), timeout=15):
            pass
    except (urllib.error.URLError, OSError) as error:
        raise DtlabError(f"lab: Debian mirror unreachable ({release_url}: {error}); check the host's network"
                         " and apt sources, then retry") from error


def _logged(argv: list[str], log_path: Path, what: str) -> None:
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        try:
            result = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S,
                                    env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        except subprocess.TimeoutExpired as error:
            raise DtlabError(f"lab: {what} took more than {BUILD_TIMEOUT_S} s; see {log_path}") from error
    if result.returncode != 0:
        last = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()][-1:]
        raise DtlabError(f"lab: {what} failed ({last[0] if last else result.returncode}); see {log_path}")


def _bootstrap(config: LabConfig, rootfs: Path, log_path: Path) -> None:
    """Debian's minbase with the base packages (they make a node) and the extra ones (heavy packages the
    roles install anyway), from the sources the nodes use later. No recommends, as the roles install;
    apt's package lists stay, as a node's first apt task expects them."""
    packages = [*config.image_base_packages, *config.image_extra_packages]
    _logged(["mmdebstrap", "--variant=minbase", f"--include={','.join(packages)}", "--skip=cleanup/apt/lists",
             "--aptopt=Acquire::Languages \"none\"",
             "--dpkgopt=force-unsafe-io",  # fewer fsyncs; a failed build is discarded whole anyway
             config.image_suite, str(rootfs), *_node_sources(config)],
            log_path, "mmdebstrap (Debian mirror unreachable or a package missing?)")


def _node_sources(config: LabConfig) -> list[str]:
    return [f"deb {source.uri} {source.suite} {' '.join(source.components)}"
            for source in host.node_apt_sources(config.image_suite)]


def _write_apt_sources(config: LabConfig, rootfs: Path) -> None:
    lines = _node_sources(config)
    (rootfs / "etc/apt/sources.list").write_text(
        "# From the lab host's apt sources; nodes reach them through the lab's apt proxy.\n"
        + "\n".join(lines) + "\n")
    (rootfs / "etc/apt/apt.conf.d/90dtlab-lab").write_text('Acquire::Languages "none";\n')


def _make_node_neutral(rootfs: Path) -> None:
    """Remove what must differ per node (seeded at node creation) and what must stay empty."""
    for host_key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        host_key.unlink()
    (rootfs / "etc/resolv.conf").write_text("")  # empty on purpose: torchrun stalls on DNS otherwise
    (rootfs / "etc/machine-id").write_text("")
    (rootfs / "etc/hostname").unlink(missing_ok=True)
    # Installed but not started: only the master runs PostgreSQL, and its role enables it there. The docker
    # role starts Docker once its daemon.json is written (a node may not touch iptables, Docker's default).
    for unit in ("postgresql.service", "docker.service", "docker.socket", "containerd.service"):
        if (rootfs / "lib/systemd/system" / unit).exists():
            subprocess.run(["chroot", str(rootfs), "systemctl", "disable", unit],
                           capture_output=True, timeout=60, check=True)
