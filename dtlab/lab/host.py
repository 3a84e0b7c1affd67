"""The host side of the lab: running commands, preflight checks, and the host's apt sources."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dtlab.errors import DtlabError

# Tool -> Debian package that provides it (the setup script installs these).
REQUIRED_TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
    "mount": "mount",
    "chroot": "coreutils",
}
APT_SOURCES_LIST = Path("/etc/apt/sources.list")
APT_SOURCES_DIR = Path("/etc/apt/sources.list.d")
# Disk a first image build and three fresh nodes need (image ~1 GB, node uppers small at first).
MIN_FREE_BYTES_BUILD = 3 * 2**30
MIN_FREE_BYTES_UP = 512 * 2**20


def run(argv: list[str], *, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run a host command, capture its output; a failure becomes a one-line DtlabError."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError as error:
        raise DtlabError(f"{argv[0]}: not installed; run `invoke lab.up` as root to install it") from error
    except subprocess.TimeoutExpired as error:
        raise DtlabError(f"`{' '.join(argv)}` took more than {timeout:.0f} s;"
                         " check the host's load") from error
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise DtlabError(f"`{' '.join(argv)}` failed: {detail[-1] if detail else result.returncode}")
    return result


def require_root() -> None:
    if os.geteuid() != 0:
        raise DtlabError("lab: needs root (network namespaces, mounts, nspawn); run it with sudo or as root")


def ensure_tools() -> None:
    """Install missing host tools with apt-get (we run as root), or say which packages to install."""
    missing = sorted({package for tool, package in REQUIRED_TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    print(f"lab: installing host packages: {' '.join(missing)}")
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(install, capture_output=True, text=True, timeout=600, env=environment)
    if result.returncode != 0:  # perhaps stale or missing package lists
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=600, env=environment)
        result = subprocess.run(install, capture_output=True, text=True, timeout=600, env=environment)
    if result.returncode != 0:
        raise DtlabError(f"lab: host packages missing: {' '.join(missing)}; run `{' '.join(install)}`")


def require_kernel_features() -> None:
    if not Path("/proc/self/ns/net").exists():
        raise DtlabError("lab: this kernel has no network namespaces (CONFIG_NET_NS);"
                         " use a stock Linux kernel")
    if not _filesystem_supported("overlay"):
        subprocess.run(["modprobe", "overlay"], capture_output=True, timeout=30)
    if not _filesystem_supported("overlay"):
        # Not fatal: node roots fall back to full copies (slower, more disk).
        print("lab: overlayfs unavailable (modprobe overlay failed); node roots will be full copies")


# Every node's systemd uses inotify as root (no user namespaces): the kernel's default of 128
# instances per user runs out at about a dozen nodes, and sshd or getty then fail to start.
INOTIFY_MINIMUMS = {"fs/inotify/max_user_instances": 8192, "fs/inotify/max_user_watches": 524288}


def raise_inotify_limits() -> None:
    """Raise (never lower) the host's inotify limits to what many booted nodes need."""
    for key, minimum in INOTIFY_MINIMUMS.items():
        path = Path("/proc/sys") / key
        if int(path.read_text()) < minimum:
            path.write_text(f"{minimum}\n")


def _filesystem_supported(fstype: str) -> bool:
    return any(line.split()[-1] == fstype for line in Path("/proc/filesystems").read_text().splitlines())


def overlay_supported() -> bool:
    return _filesystem_supported("overlay")


def require_free_disk(directory: Path, needed_bytes: int) -> None:
    existing = directory
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < needed_bytes:
        raise DtlabError(f"lab: {existing} has {free / 2**30:.1f} GiB free,"
                         f" needs {needed_bytes / 2**30:.1f} GiB;"
                         " free disk space or set DTLAB_LAB_ROOT / DTLAB_IMAGE_CACHE elsewhere")


@dataclass(frozen=True)
class AptSource:
    uri: str          # e.g. http://<mirror>/debian, as the host's apt sources have it
    suite: str
    components: tuple[str, ...]

    @property
    def host(self) -> str:
        return urlsplit(self.uri).hostname or ""


def host_apt_sources() -> list[AptSource]:
    """The enabled `deb` entries of the host (one-line and deb822 formats); never a hard-coded mirror."""
    sources: list[AptSource] = []
    files = [APT_SOURCES_LIST] if APT_SOURCES_LIST.exists() else []
    files += sorted(APT_SOURCES_DIR.glob("*.list")) + sorted(APT_SOURCES_DIR.glob("*.sources"))
    for path in files:
        text = path.read_text(errors="replace")
        sources += _parse_deb822(text) if path.suffix == ".sources" else _parse_one_line(text)
    return sources


def _parse_one_line(text: str) -> list[AptSource]:
    found = []
    for line in text.splitlines():
        line = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0])  # drop [arch=... signed-by=...]
        words = line.split()
        if len(words) >= 3 and words[0] == "deb":
            found.append(AptSource(words[1].rstrip("/"), words[2], tuple(words[3:])))
    return found


def _parse_deb822(text: str) -> list[AptSource]:
    found = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            field, value = line.split(":", 1)
            fields[field.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                found.append(AptSource(uri.rstrip("/"), suite, tuple(fields.get("components", "").split())))
    return found


def debian_mirror(suite: str) -> AptSource:
    """The host's source for `suite` itself (not -updates/-security): what the image build checks first."""
    for source in host_apt_sources():
        if source.suite == suite and "main" in source.components and source.uri.startswith("http"):
            return source
    raise DtlabError(f"lab: no `deb <mirror> {suite} main` in /etc/apt/sources*; add the Debian {suite}"
                     " mirror to the host's apt sources")


def node_apt_sources(suite: str) -> list[AptSource]:
    """Sources the nodes use through the apt proxy: the host's plain-http entries for `suite`*."""
    return [source for source in host_apt_sources()
            if source.suite.split("-")[0] == suite and source.uri.startswith("http://")]
