"""The serving load test (scenario C, issue #54): bounded request loops at fixed concurrency from the
controller against the cluster's own addresses, every answer checked against the trainer's.

Each level sends `requests` requests, one review each, over `concurrency` threads that each keep one
connection per target; request k carries review k mod len(reviews) to target k mod len(targets). A
request is an error when it fails, times out or answers other than 200 with one label; a mismatch when its
label differs from the trainer's own evaluation of that review (trainer/serving.expected_predictions).

    # LoadPlan is dtlab.matrix.tasks's
    plan = LoadPlan.from_dict({"concurrency": [1, 8, 32], "requests": 256}, where="serve")
    targets = cluster_targets(["http://10.77.0.11:8100/predict"], cluster_hosts, where="serve")
    levels = load_test(targets, reviews, expected_labels, plan)
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass

from dtlab.errors import DtlabError
from dtlab.matrix.tasks import LoadPlan
from dtlab.waiting import wait_until


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.path}"


def cluster_targets(urls: list[str], cluster_hosts: set[str], where: str) -> list[Target]:
    """The servers' URLs as targets, refused in one line for one that is not on a cluster node's address:
    a load test never leaves the cluster."""
    targets = []
    for url in urls:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname or parsed.port is None:
            raise DtlabError(f"{where}: {url!r} is not http://HOST:PORT/PATH")
        if parsed.hostname not in cluster_hosts:
            raise DtlabError(f"{where}: {parsed.hostname} is not a cluster node's address "
                             f"({', '.join(sorted(cluster_hosts))}); a load test stays on the cluster")
        targets.append(Target(parsed.hostname, parsed.port, parsed.path or "/"))
    if not targets:
        raise DtlabError(f"{where}: no server to load")
    return targets


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    mismatches: int
    p50_ms: float
    p99_ms: float
    throughput_rps: float  # answered requests per second of the level's wall time
    wall_s: float
    first_error: str | None

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (q in (0, 100]): a latency some request really had."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(len(ordered) * q / 100))) - 1]


class _Client:
    """One thread's connections, one per target, kept alive between its requests."""

    def __init__(self, timeout_s: float):
        self.timeout_s, self.connections = timeout_s, {}

    def predict(self, target: Target, text: str) -> list[int]:
        body = json.dumps({"texts": [text]})
        for attempt in (1, 2):  # a kept-alive connection the server closed is opened once more
            connection = self.connections.get(target) or http.client.HTTPConnection(
                target.host, target.port, timeout=self.timeout_s)
            self.connections[target] = connection
            try:
                connection.request("POST", target.path, body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                self.connections.pop(target)
                if attempt == 2:
                    raise
                continue
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status} from {target.url}: {payload[:200]!r}")
            return json.loads(payload)["labels"]
        raise AssertionError("unreachable")

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close()


def run_level(targets: list[Target], reviews: list[str], expected: list[int], concurrency: int,
              requests: int, timeout_s: float) -> LevelResult:
    latencies: list[float] = []
    errors, mismatches, first_error = 0, 0, [None]
    lock = threading.Lock()

    def loop(offset: int) -> None:
        nonlocal errors, mismatches
        client = _Client(timeout_s)
        try:
            for k in range(offset, requests, concurrency):
                review = k % len(reviews)
                sent = time.perf_counter()
                try:
                    labels = client.predict(targets[k % len(targets)], reviews[review])
                    failed = None if len(labels) == 1 else f"{len(labels)} labels for one review"
                except Exception as error:  # noqa: BLE001 - any failure is the server's error, counted
                    labels, failed = None, f"{type(error).__name__}: {error}"
                took = time.perf_counter() - sent
                with lock:
                    if failed:
                        errors += 1
                        first_error[0] = first_error[0] or failed
                    else:
                        latencies.append(took)
                        mismatches += labels[0] != expected[review]
        finally:
            client.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(offset,), daemon=True) for offset in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:  # each loop is bounded: requests/concurrency requests of timeout_s at most
        thread.join()
    wall = time.perf_counter() - started
    return LevelResult(concurrency, requests, errors, mismatches, 1000 * percentile(latencies, 50),
                       1000 * percentile(latencies, 99), len(latencies) / wall, wall, first_error[0])


def wait_ready(targets: list[Target], review: str, timeout_s: float) -> None:
    """Until every target answers a prediction (a server loads its model before it listens)."""
    client = _Client(timeout_s=5)

    def answers(target: Target) -> bool:
        try:
            return len(client.predict(target, review)) == 1
        except (OSError, RuntimeError, ValueError, KeyError):
            client.connections.pop(target, None)
            return False

    try:
        for target in targets:
            wait_until(lambda target=target: answers(target), timeout_s=timeout_s, every_s=1,
                       what=f"the server at {target.url} to answer")
    finally:
        client.close()


def load_test(targets: list[Target], reviews: list[str], expected: list[int], plan: LoadPlan) -> list[dict]:
    """Every level of the plan, lowest concurrency first, on servers that already answer."""
    if len(reviews) != len(expected) or not reviews:
        raise DtlabError(f"load test: {len(reviews)} reviews but {len(expected)} expected labels")
    return [run_level(targets, reviews, expected, level, plan.requests, plan.timeout_s).as_dict()
            for level in plan.concurrency]
