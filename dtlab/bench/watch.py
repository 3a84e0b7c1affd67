"""The unit watch: while a cell runs, every node's unit state, asked from outside its log streams, so a
node that falls silent or a unit that ends under an open log stream stops the cell within a minute."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dtlab import remote
from dtlab.errors import DtlabError
from dtlab.inventory import Node
from dtlab.outcome import AttemptFailure

# connection that gives up after PROBE_TIMEOUT_S. A node silent for SILENT_AFTER_S is down or cut off,
# so a fault is noticed within SILENT_AFTER_S + WATCH_EVERY_S + PROBE_TIMEOUT_S = 50 s.
WATCH_EVERY_S = 10
PROBE_TIMEOUT_S = 10
SILENT_AFTER_S = 30
# A unit that has ended while its log stream stays open for this long is treated as ended.
STREAM_GRACE_S = 15


class UnitWatch:
    """Watches a running cell from outside its log streams: every WATCH_EVERY_S, each node's unit
    state, from one daemon thread per node over its own SSH connection (reopened after an error).

    A stream can outlive its unit (a killed follower shell) or hang on a silent network; the watch
    sees both within a minute: `fault(streaming)` names the first such node. The threads are daemons:
    a probe stuck on a dead link never holds the harness up.
    """

    def __init__(
        self,
        jobs: list[tuple[Node, str]],
        say: Callable[[str], None],
        sessions: remote.Sessions | None = None,
    ):
        self.jobs = jobs
        self.say = say
        self.sessions = sessions
        now = time.monotonic()
        self.last_answer = {node.name: now for node, _ in jobs}
        self.ended_since: dict[str, float] = {}
        self.seen_running: set[str] = set()
        self.states: dict[str, str] = {}
        self._stop = threading.Event()
        self._silent_said: set[str] = set()
        self._threads = [
            threading.Thread(target=self._watch, args=job, name=f"dtlab-watch-{job[0].name}", daemon=True)
            for job in jobs
        ]

    def start(self) -> UnitWatch:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, node: Node, unit: str) -> None:
        # The cell's shared connection first; after an error, probes of its own, so a probe never
        # closes the connection the unit's log stream runs on.
        own = None
        while not self._stop.wait(WATCH_EVERY_S):
            try:
                if self.sessions is not None and own is None:
                    shared = self.sessions.connection(node)
                    state = remote.unit_state(node, unit, timeout=PROBE_TIMEOUT_S, connection=shared)
                else:
                    own = own or remote.connect(node, timeout=PROBE_TIMEOUT_S)
                    state = remote.unit_state(node, unit, timeout=PROBE_TIMEOUT_S, connection=own)
            except DtlabError:
                if own is not None:
                    own.close()
                own = remote.connect(node, timeout=PROBE_TIMEOUT_S)  # not opened yet: opens on use
                continue
            now = time.monotonic()
            self.last_answer[node.name] = now
            self.states[node.name] = state
            if state in (*remote.RUNNING_OR_STARTING, "deactivating"):  # a cell's unit runs while it stops
                self.seen_running.add(node.name)
            elif node.name in self.seen_running:  # before its start a unit reads inactive too
                self.ended_since.setdefault(node.name, now)
        if own is not None:
            own.close()

    def fault(self, streaming: set[str]) -> AttemptFailure | None:
        """The first node that is silent, or whose unit ended while its stream (in `streaming`) is open."""
        now = time.monotonic()
        for node, _unit in self.jobs:
            silent = now - self.last_answer[node.name]
            if silent >= SILENT_AFTER_S:
                reason = (f"{node.name} has not answered for {silent:.0f} s (node down or network "
                          "partition); the cell is stopped, not timed")
                if node.name not in self._silent_said:
                    self._silent_said.add(node.name)
                    self.say(f"[yellow]{reason}[/]")
                return AttemptFailure(reason, node.name)
            ended = self.ended_since.get(node.name)
            if node.name in streaming and ended is not None and now - ended >= STREAM_GRACE_S:
                reason = (f"the unit on {node.name} ended ({self.states.get(node.name)}) "
                          f"{now - ended:.0f} s ago but its log stream stayed open")
                self.say(f"[yellow]{reason}[/]")
                return AttemptFailure(reason, node.name)
        return None
