"""What the bundle's builders share with the world outside: a tool run (`_run`) and a URL fetched
(`_download`), each failure one DtlabError line, their time limits, and `Say`, the line printer they report
through."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

from dtlab.errors import DtlabError

DOWNLOAD_SOCKET_TIMEOUT_S = 60  # no byte for this long: the download fails (a whole release may take minutes)
PIP_TIMEOUT_S = 3600
APT_TIMEOUT_S = 1800
CHUNK = 1 << 20

Say = Callable[[str], None]


def _run(argv: list[str], what: str, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise DtlabError(f"bundle: {what}: no answer in {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise DtlabError(f"bundle: {what} failed: {tail[-1] if tail else f'exit {done.returncode}'}")
    return done


def _download(url: str, target: Path, what: str) -> None:
    """One file, fetched whole into place; a failure is one line naming the URL."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    try:
        with (urllib.request.urlopen(url, timeout=DOWNLOAD_SOCKET_TIMEOUT_S) as response,  # noqa: S310
              partial.open("wb") as handle):
            shutil.copyfileobj(response, handle, CHUNK)
    except (OSError, ValueError) as error:
        partial.unlink(missing_ok=True)
        raise DtlabError(f"bundle: {what}: cannot fetch {url} ({error}); build this part where it can be"
                         " reached (docs/offline.md)") from None
    partial.replace(target)
