"""cluster.doctor, and the health gate bench.all runs before its first cell (docs/health-gate.md).

A diagnosis is cluster.check's rows (every platform's services, each node's clock offset and free disk,
the trainer env, the socket interface, each GPU usable by a matmul), judged against the inventory's
thresholds, plus an all-reduce between every two training workers with the trainer's own backend (gloo
on cpu, NCCL on cuda): trainer/allreduce_probe.py, started on both nodes of a pair at once over SSH,
from the trainer venv and code, with the node's socket interface. Pairs that share no node run at once
(a round robin), so N workers take N-1 rounds; each pair's latency (an 8-byte all_reduce) and algorithm
bandwidth (a 16 MiB one) must meet the inventory's dtlab_max_allreduce_latency_ms and
dtlab_min_allreduce_bandwidth_mb_s.

As the gate, a failed diagnosis stops bench.all before anything is reserved or written (GateRefused,
one line per failure); a passed one is saved beside the results (results/<cluster>/gate/), where the
report reads it. When a cell fails on a node, `diagnose_node` re-checks that node alone: its own rows and
its all-reduce with a healthy peer; bench drains a node that fails it for the rest of the matrix.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dtlab import cluster as cluster_module
from dtlab import remote
from dtlab.cluster import CheckRow
from dtlab.errors import DtlabError
from dtlab.files import atomic_write_text
from dtlab.inventory import Cluster, Node

# The JSON's shape (cluster.doctor --json, the gate file); the report reads this version.
GATE_FORMAT = 1
PROBE_MODULE = "trainer.allreduce_probe"
# Latency from the tiny message, bandwidth from the large one; the middle one shows where the curve
# bends. 16 MiB takes about 0.15 s on 1 GbE, so a pair is measured in about a second.
MESSAGE_SIZES = (8, 64 << 10, 16 << 20)
ITERATIONS = 5  # timed all_reduces per size (their median counts); WARMUP untimed ones first
WARMUP = 2
# The pair's group forms, and each collective ends, within GROUP_TIMEOUT_S; the node's `timeout` ends
# the probe after PROBE_DEADLINE_S whatever it waits on (torch tries a store connect twice).
GROUP_TIMEOUT_S = 15
PROBE_DEADLINE_S = 45
# A worker all-reduces only once these rows pass: without them its probe could only time out.
READY_CHECKS = ("ssh", "trainer env", "socket interface")
ALLREDUCE_CHECK = "all-reduce"
THRESHOLD_KEYS = (
    "dtlab_max_clock_skew_s",
    "dtlab_min_free_disk_gb",
    "dtlab_max_allreduce_latency_ms",
    "dtlab_min_allreduce_bandwidth_mb_s",
)


@dataclass(frozen=True)
class Thresholds:
    max_clock_skew_s: float
    min_free_disk_gb: float
    max_allreduce_latency_ms: float
    min_allreduce_bandwidth_mb_s: float

    @classmethod
    def of(cls, cluster: Cluster) -> Thresholds:
        """The inventory's values; one that is not a number is one DtlabError line (exit 2)."""
        return cls(*(cluster_module.threshold(cluster, key) for key in THRESHOLD_KEYS))

    def as_json(self) -> dict[str, float]:
        """By the inventory's names, so a reader knows what to change."""
        return dict(
            zip(
                THRESHOLD_KEYS,
                (
                    self.max_clock_skew_s,
                    self.min_free_disk_gb,
                    self.max_allreduce_latency_ms,
                    self.min_allreduce_bandwidth_mb_s,
                ),
                strict=True,
            )
        )


@dataclass(frozen=True)
class PairResult:
    """One pair's all-reduce: per message size its median seconds and algorithm bandwidth, or why not."""

    nodes: tuple[str, str]
    by_size: tuple[dict[str, float], ...] = ()
    error: str | None = None

    @property
    def label(self) -> str:
        return "↔".join(self.nodes)

    @property
    def latency_ms(self) -> float | None:
        return self.by_size[0]["seconds"] * 1e3 if self.by_size else None

    @property
    def bandwidth_mb_s(self) -> float | None:
        return self.by_size[-1]["algbw_bytes_per_s"] / 1e6 if self.by_size else None

    def as_json(self) -> dict[str, Any]:
        return {
            "nodes": list(self.nodes),
            "latency_ms": self.latency_ms,
            "bandwidth_mb_s": self.bandwidth_mb_s,
            "by_size": list(self.by_size),
            "error": self.error,
        }


@dataclass
class Diagnosis:
    """Every row, judged; the pairs measured; what they were judged against."""

    cluster: Cluster
    rows: list[CheckRow]
    pairs: list[PairResult]
    thresholds: Thresholds
    backend: str
    started_at: str
    seconds: float
    scope: str = "cluster"  # or the one node a re-check was about

    @property
    def failed_rows(self) -> list[CheckRow]:
        return cluster_module.failed(self.rows)

    @property
    def healthy(self) -> bool:
        return not self.failed_rows

    @property
    def failures(self) -> list[str]:
        """One line per failed check: where, which, why."""
        return [f"{row.node}: {row.check}: {row.detail}" for row in self.failed_rows]

    def as_json(self) -> dict[str, Any]:
        return {
            "format": GATE_FORMAT,
            "cluster": self.cluster.name,
            "inventory": str(self.cluster.inventory_path),
            "scope": self.scope,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 2),
            "status": "healthy" if self.healthy else "failed",
            "checks": [_row_json(row) for row in self.rows],
            "failures": self.failures,
            "thresholds": self.thresholds.as_json(),
            "allreduce": {
                "backend": self.backend,
                "message_bytes": list(MESSAGE_SIZES),
                "iterations": ITERATIONS,
                "pairs": [pair.as_json() for pair in self.pairs],
            },
        }

    def summary(self) -> str:
        """One line: how many checks passed, each pair's numbers, how long it took."""
        judged = [row for row in self.rows if row.required]
        if not self.healthy:
            return f"{len(self.failed_rows)} of {len(judged)} check(s) failed in {self.seconds:.1f} s"
        measured = [
            f"{p.label} {p.latency_ms:.2f} ms, {p.bandwidth_mb_s:.0f} MB/s" for p in self.pairs if not p.error
        ]
        links = f"; all-reduce ({self.backend}) {'; '.join(measured)}" if measured else ""
        return f"{len(judged)} checks passed{links}; {self.seconds:.1f} s"


def _row_json(row: CheckRow) -> dict[str, Any]:
    verdict = ("pass" if row.ok else "fail") if row.required else "note"  # a note never fails the gate
    entry = {"check": row.check, "node": row.node, "verdict": verdict, "detail": row.detail}
    if row.value is not None:
        entry["value"] = row.value
    return entry


class GateRefused(DtlabError):
    """The gate failed: the matrix does not start. One line per failure, after one that says so."""

    exit_code = 1

    def __init__(self, diagnosis: Diagnosis):
        self.diagnosis = diagnosis
        lines = [
            f"health gate: {len(diagnosis.failed_rows)} check(s) failed on {diagnosis.cluster.name}: "
            "the matrix did not start, nothing was reserved or written; fix these "
            "(`invoke cluster.doctor` shows every check), or pass --skip-gate"
        ]
        lines += [f"health gate: {failure}" for failure in diagnosis.failures]
        super().__init__("\n".join(lines))


class DoctorFailed(DtlabError):
    exit_code = 1


# --- the diagnosis ------------------------------------------------------------------------------------


def diagnose(cluster: Cluster) -> Diagnosis:
    """The whole cluster: cluster.check's rows, then every pair of training workers all-reducing."""
    thresholds = Thresholds.of(cluster)  # a bad threshold stops it before any node is contacted
    started, clock = _now(), time.monotonic()
    rows = cluster_module.check(cluster)
    ready = [w for w in training_workers(cluster) if _ready(rows, w.name)]
    pairs = measure(cluster, pair_rounds([w.name for w in ready]))
    rows += allreduce_rows(pairs, thresholds) + _not_measured_rows(cluster, rows, ready)
    return Diagnosis(cluster, rows, pairs, thresholds, backend(cluster), started, time.monotonic() - clock)


def diagnose_node(cluster: Cluster, name: str, drained: Iterable[str] = ()) -> Diagnosis:
    """One node again, after a cell failed there: its own rows of cluster.check and, for a training
    worker, its all-reduce with the first other worker that answers and is not drained."""
    thresholds = Thresholds.of(cluster)
    started, clock = _now(), time.monotonic()
    node = cluster.node(name)
    everything = cluster_module.check(cluster)
    rows = [row for row in everything if row.node == name]
    pairs: list[PairResult] = []
    workers = training_workers(cluster)
    if node in workers and _ready(everything, name):
        skip = {name, *drained}
        peer = next((w for w in workers if w.name not in skip and _ready(everything, w.name)), None)
        if peer is None:
            rows.append(
                CheckRow(
                    ALLREDUCE_CHECK,
                    name,
                    True,
                    "not measured: no healthy peer to all-reduce with",
                    required=False,
                )
            )
        else:
            in_order = [w.name for w in workers]
            pairs = measure(cluster, [[tuple(sorted((name, peer.name), key=in_order.index))]])
            rows += allreduce_rows(pairs, thresholds)
    return Diagnosis(
        cluster, rows, pairs, thresholds, backend(cluster), started, time.monotonic() - clock, scope=name
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _ready(rows: list[CheckRow], name: str) -> bool:
    """The node answered and has what the probe needs (READY_CHECKS all passed)."""
    mine = [row for row in rows if row.node == name and row.check in READY_CHECKS]
    return {row.check for row in mine} >= set(READY_CHECKS) and all(row.ok for row in mine)


def training_workers(cluster: Cluster) -> list[Node]:
    """The workers cells train on: on a cuda inventory those with GPUs (as placement takes them)."""
    if cluster.device == "cuda":
        return [w for w in cluster.workers if w.uses_gpu]
    return list(cluster.workers)


def backend(cluster: Cluster) -> str:
    """The trainer's: NCCL where cells train on GPUs (dtlab_device cuda), gloo on CPU."""
    return "nccl" if cluster.device == "cuda" else "gloo"


def pair_rounds(names: list[str]) -> list[list[tuple[str, str]]]:
    """Every pair of `names` once, in rounds of pairs that share no node (the circle method): each
    round's pairs run at once, so no link is measured while its node also serves another pair."""
    players: list[str | None] = list(names) + ([None] if len(names) % 2 else [])
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        matched = [(players[i], players[-1 - i]) for i in range(half)]
        rounds.append([tuple(sorted(pair, key=names.index)) for pair in matched if None not in pair])
        players = [players[0], players[-1], *players[1:-1]]  # rotate all but the first
    return [round_ for round_ in rounds if round_]


# --- the all-reduce -------------------------------------------------------------------------------------


def probe_command(cluster: Cluster, node: Node, rank: int, first: Node) -> str:
    """The probe on one node of a pair, as a trainer unit runs: the trainer user, the venv's python, the
    code on PYTHONPATH, the socket interface from the node's env file, the cell's GPUs (the first one)."""
    code = shlex.quote(cluster.code_dir)
    uses_gpu = cluster.device == "cuda" and node.gpu_indices
    gpu = f"CUDA_VISIBLE_DEVICES={node.gpu_indices[0]} " if uses_gpu else ""
    argv = [
        cluster.python,
        "-m",
        PROBE_MODULE,
        "--rank",
        str(rank),
        "--world-size",
        "2",
        "--master-addr",
        first.address,
        "--master-port",
        str(int(cluster.require("dtlab_doctor_port"))),
        "--device",
        cluster.device,
        "--sizes",
        ",".join(map(str, MESSAGE_SIZES)),
        "--iterations",
        str(ITERATIONS),
        "--warmup",
        str(WARMUP),
        "--timeout",
        str(GROUP_TIMEOUT_S),
    ]
    return (
        f"set -a; . {shlex.quote(cluster.socket_env_file)}; set +a; cd {code} && "
        f"exec runuser -u {shlex.quote(cluster.user)} -- timeout -k 5 {PROBE_DEADLINE_S} "
        f"env PYTHONPATH={code} OMP_NUM_THREADS=1 {gpu}{shlex.join(argv)}"
    )


def measure(cluster: Cluster, rounds: list[list[tuple[str, str]]]) -> list[PairResult]:
    """Each pair's all-reduce, round after round; a round's pairs (which share no node) at once."""
    results = []
    for round_ in rounds:
        commands = {}
        for first, second in round_:
            lead = cluster.node(first)
            commands[first] = probe_command(cluster, lead, 0, lead)
            commands[second] = probe_command(cluster, cluster.node(second), 1, lead)
        answers = remote.fan_out(
            [cluster.node(name) for name in commands],
            lambda node, commands=commands: remote.run(
                node, commands[node.name], timeout=PROBE_DEADLINE_S + 15
            ),
        )
        results += [pair_result(pair, answers[pair[0]], answers[pair[1]]) for pair in round_]
    return results


def pair_result(pair: tuple[str, str], *answers: remote.CommandResult | BaseException) -> PairResult:
    """Rank 0's measurement, or the first side's reason why there is none."""
    reports = [_probe_report(answer) for answer in answers]
    for report in reports:
        if "error" in report:
            return PairResult(pair, error=report["error"])
    return PairResult(pair, tuple(reports[0]["by_size"]))


def _probe_report(answer: remote.CommandResult | BaseException) -> dict[str, Any]:
    if isinstance(answer, BaseException):
        return {"error": str(answer)}
    node = answer.node
    if answer.exit_code == 124:
        return {"error": f"{node}: no result within {PROBE_DEADLINE_S} s"}
    for line in reversed(answer.stdout.strip().splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and ("by_size" in report or "error" in report):
            return {**report, "error": f"{node}: {report['error']}"} if "error" in report else report
    why = (answer.stderr or answer.stdout).strip().splitlines()
    return {"error": f"{node}: exit {answer.exit_code}: {why[-1][:200] if why else 'no output'}"}


def allreduce_rows(pairs: list[PairResult], thresholds: Thresholds) -> list[CheckRow]:
    """One row per pair: its latency and bandwidth against the inventory's limits."""
    rows = []
    for pair in pairs:
        if pair.error:
            rows.append(CheckRow(ALLREDUCE_CHECK, pair.label, False, f"not measured: {pair.error}"))
            continue
        latency, bandwidth = pair.latency_ms, pair.bandwidth_mb_s
        slow = latency > thresholds.max_allreduce_latency_ms
        narrow = bandwidth < thresholds.min_allreduce_bandwidth_mb_s
        detail = (
            f"latency {latency:.2f} ms ({'over' if slow else 'limit'} "
            f"{thresholds.max_allreduce_latency_ms:g}), bandwidth {bandwidth:.0f} MB/s "
            f"({'under' if narrow else 'need'} {thresholds.min_allreduce_bandwidth_mb_s:g})"
        )
        rows.append(CheckRow(ALLREDUCE_CHECK, pair.label, not (slow or narrow), detail))
    return rows


def _not_measured_rows(cluster: Cluster, rows: list[CheckRow], ready: list[Node]) -> list[CheckRow]:
    """A note per training worker left out of the all-reduce (its own failed rows say why), or why no
    pair exists at all."""
    workers = training_workers(cluster)
    notes = [
        CheckRow(
            ALLREDUCE_CHECK,
            w.name,
            True,
            "not measured: the node failed "
            + ", ".join(sorted({r.check for r in rows if r.node == w.name and not r.ok})),
            required=False,
        )
        for w in workers
        if w not in ready
    ]
    if len(workers) < 2:
        notes.append(
            CheckRow(
                ALLREDUCE_CHECK,
                cluster.name,
                True,
                f"not measured: {len(workers)} training worker(s), no pair",
                required=False,
            )
        )
    return notes


# --- the gate's file, beside the results ------------------------------------------------------------


@dataclass
class GateFile:
    """results/<cluster>/gate/gate-<time>.json: the diagnosis that preceded one matrix, and the
    re-checks of nodes during it. Never a recorded run: the store's rows and runs/ are not touched."""

    path: Path
    content: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def write(cls, directory: Path, diagnosis: Diagnosis | None, matrix: dict[str, Any]) -> GateFile:
        """The passed gate (or, diagnosis None, the note that --skip-gate skipped it) before a matrix."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        content = (
            diagnosis.as_json()
            if diagnosis
            else {"format": GATE_FORMAT, "status": "skipped", "started_at": _now()}
        )
        gate = cls(directory / f"gate-{stamp}.json", {**content, "matrix": matrix, "rechecks": []})
        gate.save()
        return gate

    def add_recheck(self, diagnosis: Diagnosis, after_cell: str, drained: bool) -> None:
        self.content["rechecks"].append({**diagnosis.as_json(), "after_cell": after_cell, "drained": drained})
        self.save()

    def save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.content, indent=2) + "\n")


# --- cluster.doctor's table --------------------------------------------------------------------------


def render(diagnosis: Diagnosis, console=None) -> None:
    """cluster.check's table (the all-reduce rows with it), then the pairs as a node x node matrix."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(highlight=False)
    cluster_module.render(diagnosis.rows, diagnosis.cluster, console, command="cluster.doctor")
    if not diagnosis.pairs:
        return
    names = [n.name for n in training_workers(diagnosis.cluster)]
    limits = diagnosis.thresholds
    matrix = Table(
        title=f"all-reduce ({diagnosis.backend}): latency (limit "
        f"{limits.max_allreduce_latency_ms:g} ms) / bandwidth (need "
        f"{limits.min_allreduce_bandwidth_mb_s:g} MB/s)"
    )
    matrix.add_column("")
    for name in names:
        matrix.add_column(name)
    by_pair = {frozenset(pair.nodes): pair for pair in diagnosis.pairs}
    for row_name in names:
        cells = []
        for column in names:
            pair = by_pair.get(frozenset((row_name, column)))
            cells.append(
                "—"
                if pair is None
                else "[red]not measured[/]"
                if pair.error
                else f"{pair.latency_ms:.2f} ms / {pair.bandwidth_mb_s:.0f} MB/s"
            )
        matrix.add_row(row_name, *cells)
    console.print(matrix)
