"""One row of cluster.check's table, and what every check reads: each node's answers to the one probe
script cluster.check sends (key=value lines; `service.<unit>=<state>` for each installed service)."""

from __future__ import annotations

from dataclasses import dataclass

# Per node name: the probe script's key=value answers (dtlab.cluster builds the script).
NodeStates = dict[str, dict[str, str]]


@dataclass(frozen=True)
class CheckRow:
    check: str
    node: str
    ok: bool
    detail: str
    required: bool = True  # informational rows never fail the check
    value: float | None = None  # the measured number the verdict judged (clock skew s, free GiB), for JSON


def failed(rows: list[CheckRow]) -> list[CheckRow]:
    return [r for r in rows if r.required and not r.ok]


def service_state(node_states: NodeStates, node: str, unit: str) -> str | None:
    """systemd's active state of one unit on one node (active, failed, ...); None where not installed."""
    return node_states.get(node, {}).get(f"service.{unit}")
