"""Fault plans: one fault injected into a running cell over SSH once epoch k is checkpointed, and what
recovering from it cost. bench runs a FaultRun beside a faulted cell's attempts; docs/faults.md.

"After epoch k" is the same moment on every platform: rank 0 has written epoch k's checkpoint and says
so in output_dir/checkpointed_epoch (trainer.progress). The fault hits the node the plan names, else the
last worker that runs ranks of the attempt (`hit_node`); each platform's own recovery then runs as
configured (its Platform.recovery says how, and bench hands that line to the FaultRun), with dtlab's
retry from the checkpoint behind it.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from dtlab import remote
from dtlab.cell import Cell, Fault
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from trainer import progress

POLL_S = 0.5  # how often the trigger reads checkpointed_epoch on the cell's nodes
PROBE_TIMEOUT_S = 10
@dataclass
class FaultRecord:
    """What a fault plan did in one run of a faulted cell: stored with each of its attempts (the newest
    is the run's). Times: unix seconds; *_s: seconds after the fault."""

    spec: str
    kind: str
    node: str
    after_epoch: int
    seconds: int | None
    recovered_by: str
    run_started_unix: float
    injected_unix: float | None = None
    injected_in_attempt: int | None = None
    checkpointed_epoch: int | None = None
    injection: str = ""
    failure_noticed_unix: float | None = None
    detected_s: float | None = None
    detected_by: str = ""
    training_again_s: float | None = None
    epochs_redone: int | None = None
    total_s: float | None = None
    attempts: int = 0
    outcome: str = "failed"
    final_world_size: int | None = None  # the finishing run's workers: fewer after an elastic recovery

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def target(cluster: Cluster, cell: Cell, placed: tuple[Node, ...]) -> Node:
    """The node the fault hits as planned: the plan's, which must be one the cell runs on, else its last
    placed worker (`hit_node` may move a plan without a node to where the platform put the ranks)."""
    plan = cell.fault_plan
    if plan.node is None:
        return placed[-1]
    chosen = [node for node in placed if node.name == plan.node]
    if not chosen:
        raise DtlabError(f"fault plan of {cell.key}: node {plan.node} is not among the workers the cell runs "
                         f"on ({', '.join(node.name for node in placed)}); name one of them")
    return chosen[0]


def poll_command(output_dir: str) -> str:
    """Shell for each watched worker: line 1 the epoch rank 0 says is checkpointed (empty where it does not
    run), line 2 how many of the attempt's ranks left their PID file on this node."""
    marker = shlex.quote(f"{output_dir}/{progress.CHECKPOINTED_FILE}")
    ranks = shlex.quote(f"{output_dir}/{progress.RANKS_DIR}")
    return f"cat {marker} 2>/dev/null; echo; ls {ranks} 2>/dev/null | grep -c '[.]pid$'; true"


def parse_poll(stdout: str) -> tuple[int | None, int]:
    """(checkpointed epoch or None, rank PID files) from one node's poll_command output."""
    epoch, _, ranks = stdout.partition("\n")
    epoch, ranks = epoch.strip(), ranks.strip()
    return (int(epoch) if epoch.isdigit() else None), (int(ranks) if ranks.isdigit() else 0)


def hit_node(plan: Fault, planned: Node, watched: tuple[Node, ...], ranks_on: dict[str, int]) -> Node:
    """Where the fault hits when it fires: a named node as planned; without one, the last watched worker
    that runs ranks of this attempt. That is ddp's and Slurm's last placed worker, and for Spark and Ray,
    which pick their own workers (a 1-worker cell may run on any), wherever they put one."""
    if plan.node is not None:
        return planned
    running = [node for node in watched if ranks_on.get(node.name, 0) > 0]
    return running[-1] if running else planned


def inject_command(cluster: Cluster, plan: Fault, output_dir: str, unit: str, cell_unit: str = "",
                   held_service: str = "") -> str:
    """Shell for the hit node; prints one line saying what it did, exits 3 when there was nothing to hit.
    `unit` names a transient unit of the fault's own; `cell_unit` is the cell's unit on that node, "" where
    the cell runs none there (ranks a driver on another node started); `held_service` the platform's
    service the ranks run under there, which an elastic plan's lost node loses (lost_node_service)."""
    if plan.kind == "kill" and plan.elastic and held_service:
        # The node's platform service gone at once with the ranks under it, as when a node is lost, and
        # held stopped (the stop cancels systemd's restart) so that it does not rejoin this cell's run.
        service = shlex.quote(f"{held_service}.service")
        return (f"systemctl is-active --quiet {service} || {{ echo 'no running {held_service}'; exit 3; }}; "
                f"systemctl kill --signal=SIGKILL {service} && systemctl stop {service} && "
                f"echo 'SIGKILL to every process of {held_service}, held stopped until the cell ends'")
    if plan.kind == "kill" and plan.elastic and cell_unit:
        # The node's share of the cell gone at once, its platform agent (torchrun's) with the trainers, as
        # when a node is lost: the survivors must go on without it. A kill of the trainers alone would
        # leave the agent to restart them in place.
        service = shlex.quote(f"{cell_unit}.service")
        return (f"systemctl is-active --quiet {service} || {{ echo 'no running {cell_unit}'; exit 3; }}; "
                f"systemctl kill --signal=SIGKILL {service} && "
                f"echo 'SIGKILL to every process of {cell_unit}'")
    if plan.kind == "kill":
        # The trainer's own processes, by the PIDs each rank left on its node, checked to be the venv's
        # Python before the kill: a finished rank's PID may have been reused. On a node that runs no unit
        # of the cell (horovodrun's ranks, started over SSH) they are all of the node's share: an elastic
        # plan's lost node too.
        ranks = shlex.quote(f"{output_dir}/{progress.RANKS_DIR}")
        return (remote.kill_by_pid_files(cluster.python, f"{ranks}/*.pid")
                + '; [ -n "$killed" ] || { echo "no live trainer process"; exit 3; }; '
                'echo "kill -9 of trainer PID(s)$killed"')
    if plan.kind == "restart":  # a transient unit, a second from now: this SSH session ends cleanly first
        return (f"systemd-run --quiet --collect --on-active=1 --unit={shlex.quote(unit)} systemctl reboot "
                "&& echo 'systemctl reboot in 1 s'")
    # netdrop: the interface gloo and NCCL use goes down for N s, from a transient unit of its own,
    # so it comes back up although this SSH session (over that interface) is cut.
    env_file = shlex.quote(cluster.socket_env_file)
    body = shlex.quote(f". {env_file}; ip link set \"$GLOO_SOCKET_IFNAME\" down; sleep {plan.seconds}; "
                       "ip link set \"$GLOO_SOCKET_IFNAME\" up")
    return (f". {env_file} && [ -n \"$GLOO_SOCKET_IFNAME\" ] || "
            f"{{ echo 'no GLOO_SOCKET_IFNAME in {env_file}'; exit 3; }}; "
            f"systemd-run --quiet --collect --unit={shlex.quote(unit)} sh -c {body} && "
            f"echo \"$GLOO_SOCKET_IFNAME down for {plan.seconds} s\"")


def inject(cluster: Cluster, plan: Fault, node: Node, output_dir: str, unit: str, cell_unit: str = "",
           held_service: str = "") -> tuple[bool, str]:
    """Do it: (done, one line on what was done or why not). A kill always goes over SSH. The lab's nodes
    are containers on this machine without the right to take their own link down or to come back after
    a reboot: there a netdrop takes the node's cable (its host-side veth) down, and a restart powers the
    node off and on, as a hypervisor would; on a real cluster both go over SSH."""
    lab = cluster.var("dtlab_lab_name")
    if lab and plan.kind == "netdrop":
        from dtlab.lab.config import load_config

        veth = load_config(lab).veth_host_ifname(node.name)
        # Its own session: the link comes back up even if the harness is interrupted meanwhile.
        cut = f"ip link set {veth} down && sleep {plan.seconds}; ip link set {veth} up"
        subprocess.Popen(["sh", "-c", cut], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return True, f"the lab's link to {node.name} ({veth}) down for {plan.seconds} s"
    if lab and plan.kind == "restart":
        import dtlab.lab

        # Not a daemon: the interpreter waits for the node to be back before it exits.
        threading.Thread(target=dtlab.lab.restart_node, args=(node.name, lab),
                         name="dtlab-fault-restart").start()
        return True, f"{node.name} powered off and on (lab.restart_node)"
    try:
        answer = remote.run(node, inject_command(cluster, plan, output_dir, unit, cell_unit, held_service),
                            timeout=PROBE_TIMEOUT_S)
    except DtlabError as error:
        return False, str(error)
    said = ((answer.stdout or answer.stderr).strip().splitlines() or ["(no output)"])[-1]
    return answer.ok, f"{said} on {node.name}"


@dataclass
class FaultRun:
    """One faulted cell's run: arms the trigger in each attempt until the fault has fired, then turns
    the attempts' outcomes into its FaultRecord."""

    cluster: Cluster
    cell: Cell
    recovery: str  # how the cell's platform recovers from a lost worker (Platform.recovery)
    held_service: str = ""  # an elastic cell's lost node loses it with the ranks (Platform.lost_node_service)
    record: FaultRecord | None = None
    # The run's clock starts with its first attempt, as an undisturbed run's does (its "submitted").
    started_unix: float = field(default_factory=time.time)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _losing: str | None = None  # an elastic plan's hit node, from just before its unit is killed
    _unit_nodes: frozenset[str] = frozenset()  # where this attempt runs a unit of the cell (arm)

    @property
    def fired(self) -> bool:
        return self.record is not None and self.record.injected_unix is not None

    def arm(self, placed: tuple[Node, ...], watched: tuple[Node, ...], output_dir: str, attempt: int,
            say, sessions: remote.Sessions | None, *, unit_nodes: frozenset[str]) -> None:
        """Start watching this attempt: fire once checkpointed_epoch >= k on any of `watched`, over the
        attempt's own connections (`sessions`): a new SSH handshake per poll would load the nodes.
        `unit_nodes`: the nodes this attempt runs a unit of the cell on (a launcher's own ranks run none)."""
        self._unit_nodes = unit_nodes
        plan = self.cell.fault_plan
        node = target(self.cluster, self.cell, placed)
        if self.record is None:
            self.record = FaultRecord(plan.spec, plan.kind, node.name, plan.after_epoch, plan.seconds,
                                      self.recovery, run_started_unix=self.started_unix)
        if self.fired:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="dtlab-fault", daemon=True,
                                        args=(node, watched, output_dir, attempt, say, sessions))
        self._thread.start()

    def disarm(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(PROBE_TIMEOUT_S + 5)

    def _watch(self, node: Node, watched: tuple[Node, ...], output_dir: str, attempt: int, say,
               sessions: remote.Sessions | None) -> None:
        plan = self.cell.fault_plan
        while not self._stop.wait(POLL_S):
            answers = remote.run_all(watched, poll_command(output_dir), timeout=PROBE_TIMEOUT_S,
                                     sessions=sessions)
            polled = {name: parse_poll(answer.stdout) for name, answer in answers.items()
                      if not isinstance(answer, BaseException)}
            epochs = [epoch for epoch, _ in polled.values() if epoch is not None]
            if not epochs or max(epochs) < plan.after_epoch:
                continue
            injected = time.time()
            node = hit_node(plan, node, watched, {name: ranks for name, (_, ranks) in polled.items()})
            self.record.node = node.name
            unit = remote.unit_name(self.cell.key, "fault")
            cell_unit = remote.unit_name(self.cell.key, node.name) if node.name in self._unit_nodes else ""
            self._losing = node.name if plan.elastic else None  # set first: its unit ends as the kill returns
            done, said = inject(self.cluster, plan, node, output_dir, unit, cell_unit, self.held_service)
            if not done:
                self._losing = None
            self.record.injection = said if done else f"not injected: {said}"
            if done:
                self.record.injected_unix = injected
                self.record.injected_in_attempt = attempt
                self.record.checkpointed_epoch = max(epochs)
            say(f"[magenta]fault {plan.spec}: {self.record.injection}[/]")
            return

    def restore(self) -> str | None:
        """After the cell's last attempt: start the platform service an elastic plan's fault held stopped on
        the lost node; the node's name, or None when there was none to start. DtlabError if it would not."""
        if not (self.held_service and self.fired):
            return None
        node = self.cluster.node(self.record.node)
        service = shlex.quote(f"{self.held_service}.service")
        answer = remote.run(node, f"systemctl start {service}", timeout=PROBE_TIMEOUT_S * 6)
        if not answer.ok:
            raise DtlabError(f"host {node.name}: the fault's lost {self.held_service} did not start again: "
                             f"{(answer.stderr or answer.stdout).strip()[-200:]}; run `invoke cluster.reset`")
        return node.name

    def lost_node(self) -> str | None:
        """The node an elastic plan's fault takes out of the run for good, from the moment it is hit: its
        unit's end is the fault, not the attempt's failure (the survivors go on)."""
        return self._losing

    def noticed_failure(self) -> None:
        """The harness has just seen the attempt fail (the first such moment after the fault counts)."""
        if self.fired and self.record.failure_noticed_unix is None:
            self.record.failure_noticed_unix = time.time()

    def finish(self, attempts: int, result: dict[str, Any] | None) -> dict[str, Any]:
        """The record as of this attempt's end (ok: `result` is the run's): stored with the attempt."""
        record = self.record
        record.attempts = attempts
        record.outcome = "recovered" if result is not None and self.fired else (
            "ok, not hit" if result is not None else "failed")
        if result is None or not self.fired:
            return record.as_dict()
        injected = record.injected_unix
        timeline = result.get("timeline_unix") or {}
        if record.failure_noticed_unix is not None:
            record.detected_s = record.failure_noticed_unix - injected
            record.detected_by = "dtlab (attempt failed)"
        elif restarted := [t for t in (timeline.get("process_started"), timeline.get("training_started"))
                           if t and t > injected]:  # Ray may start the new rank 0 in an older, idle process
            record.detected_s, record.detected_by = restarted[0] - injected, "the platform (restarted it)"
        else:
            record.detected_by = "nobody: training went on"
        first_step = timeline.get("first_step_done")
        record.training_again_s = first_step - injected if first_step and first_step > injected else None
        record.epochs_redone = record.checkpointed_epoch - int(result.get("resumed_from_epoch") or 0)
        record.final_world_size = result.get("world_size")
        recorded = (result.get("harness_timeline_unix") or {}).get("recorded")
        record.total_s = recorded - record.run_started_unix if recorded else None
        return record.as_dict()
