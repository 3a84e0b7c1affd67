"""The execution step of a serve cell (scenario C, #54): the trainer's expected answers computed on a
node, the servers started on theirs, the load test run from the controller once every server answers,
then the servers stopped. The result is the cell's serve.json: every load level, with the checkpoint it
served and the accuracy of the trainer's own answers."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dtlab import launch as launching
from dtlab import remote
from dtlab.bench.record import log_tail
from dtlab.display import Display
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.loadtest import cluster_targets, load_test, wait_ready
from dtlab.outcome import AttemptFailure
from dtlab.waiting import wait_until


class ServeStep:
    """Bench's serve step, mixed into Bench (which sets these attributes, and gives stop_cell and
    _job_failure)."""

    cluster: Cluster
    display: Display | None
    sessions: remote.Sessions | None
    marks: dict[str, float]

    def execute_serving(self, planned: launching.Launch, log_dir: Path, timeout_s: int
                        ) -> tuple[dict[str, Any] | None, AttemptFailure | None]:
        serving = planned.serving
        started = time.monotonic()
        self.marks = {"units_started": time.time()}
        node, spec = serving.expected
        answer = remote.run_unit(node, spec, timeout=timeout_s, sessions=self.sessions,
                                 log_file=log_dir / f"{node.name}-expected.log")
        if not answer.ok:
            tail = log_tail(log_dir, f"{node.name}-expected")
            last = next((line for line in reversed(tail) if "error" in line.lower()),
                        f"exit {answer.exit_code}")
            return None, AttemptFailure(f"the expected answers on {node.name}: {last.strip()[:200]}",
                                        node.name, answer.exit_code, tail)
        try:
            text = remote.fetch_text(node, serving.expected_path, sessions=self.sessions)
            expected = json.loads(text or "")
        except json.JSONDecodeError:
            return None, AttemptFailure(f"no expected answers at {serving.expected_path} on {node.name}",
                                        node.name)
        hosts = {n.address for n in self.cluster.nodes}
        targets = cluster_targets(list(serving.urls), hosts, where=f"cell {planned.cell.key}")
        pool = ThreadPoolExecutor(max_workers=len(planned.jobs), thread_name_prefix="dtlab-server")
        servers: dict[Future, Any] = {
            pool.submit(remote.run_unit, n, s, timeout=timeout_s + 30, log_file=log_dir / f"{n.name}.log",
                        sessions=self.sessions): n for n, s in planned.jobs}
        try:
            ready_s = self._until_ready(servers, targets, expected["texts"][0], started, timeout_s)
            self.marks["servers_ready"] = time.time()
            levels = load_test(targets, expected["texts"], expected["labels"], serving.load)
            died = [servers[f].name for f in servers if f.done()]
            if died:
                raise DtlabError(f"the server on {died[0]} ended during the load test")
        except DtlabError as error:
            ended = next((f for f in servers if f.done()), None)
            failure = self._job_failure(servers[ended], ended, log_dir, 0, timeout_s) if ended else None
            self.stop_cell(planned.cell, quiet=True)
            pool.shutdown(wait=False, cancel_futures=True)
            return None, failure or AttemptFailure(str(error), None)
        except KeyboardInterrupt:
            self.stop_cell(planned.cell)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        self.marks["units_ended"] = time.time()
        self.stop_cell(planned.cell, quiet=True)
        pool.shutdown(wait=False)
        return {"way": planned.cell.framework, "label": planned.label, "serves": planned.cell.trained.key,
                "checkpoint": expected["checkpoint"], "epoch": expected["epoch"],
                "accuracy": expected["accuracy"], "replicas": serving.replicas, "urls": list(serving.urls),
                "levels": levels, "ready_s": ready_s, "wall_s": time.monotonic() - started}, None

    def _until_ready(self, servers: dict[Future, Any], targets, review: str, started: float,
                     timeout_s: int) -> float:
        """Seconds from the cell's start until every server answers; a server that ends first fails it."""
        def answering() -> bool:
            ended = [servers[f].name for f in servers if f.done()]
            if ended:
                raise DtlabError(f"the server on {ended[0]} ended before it answered")
            try:
                wait_ready(targets, review, timeout_s=2)
            except DtlabError:
                return False
            return True

        left = max(1.0, timeout_s - (time.monotonic() - started))
        wait_until(answering, timeout_s=left, every_s=1, what="every server to answer")
        return time.monotonic() - started
