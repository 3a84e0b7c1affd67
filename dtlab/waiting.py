"""One bounded poll for every wait in the harness: ask, sleep, ask again, never past the deadline.

    alive = wait_until(count_alive, until=lambda n: n >= 2, timeout_s=60, every_s=2)  # last answer
    wait_until(listening, timeout_s=10, every_s=0.05, what="the proxy to listen on :3142")  # or raise
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from dtlab.errors import DtlabError

T = TypeVar("T")


def wait_until(check: Callable[[], T], *, timeout_s: float, every_s: float,
               until: Callable[[T], object] = bool, what: str | None = None) -> T:
    """Call `check` every `every_s` seconds until `until(answer)` holds (default: a truthy answer),
    and return that answer.

    Bounded: `check` runs at once, then again at most every `every_s`, the last time at the deadline,
    `timeout_s` from now (so the wait lasts at most `timeout_s` plus one check). When the deadline
    passes, with `what` (the awaited event, e.g. "node1 to answer SSH") it raises DtlabError
    "timed out after N s waiting for <what>"; without it, it returns the last answer, for callers that
    act on it themselves (escalate to SIGKILL, report what is alive). An exception from `check`
    ends the wait and propagates unchanged.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        answer = check()
        if until(answer):
            return answer
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if what is None:
                return answer
            raise DtlabError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(min(every_s, remaining))


def stop_process_group(process, grace_s: float = 30) -> None:
    """End a process started with start_new_session=True, and its children, by its own process group: TERM,
    then KILL after `grace_s`. A process that has already ended is left as it is."""
    import os
    import signal
    import subprocess

    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=grace_s)
