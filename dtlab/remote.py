"""Fabric fan-out to the nodes: commands, named systemd units, live logs, file transfer.

Every run on a node is a transient systemd unit named dtlab-<cell>-<node>, so it survives a dropped
SSH session, can be found by name and stopped on every node (`systemctl stop 'dtlab-*'`), and is
bounded by RuntimeMaxSec even if the controller dies. Its output goes to a log file on the node,
which is followed live over SSH: each line reaches the controller prefixed by its node.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.guard import assert_safe_target
from dtlab.inventory import Node

UNIT_PREFIX = "dtlab-"
# Every cell's units: dtlab-<framework>-g<N>-...; narrower than dtlab-*, which would also match
# provisioned services (the *_service names in group_vars/all.yml, such as dtlab-spark-master).
CELL_UNIT_PATTERNS = tuple(f"{UNIT_PREFIX}{framework}-g*" for framework in paths.platform_names())
CONNECT_TIMEOUT_S = 10
COMMAND_TIMEOUT_S = 60
TIMED_OUT = 124  # run's exit code for a command it ended at its timeout (as timeout(1) exits)
# SSH keepalives on every connection: a silent peer is noticed by the transport too, not only by
# the harness's own probes (bench.UnitWatch), and NATs and firewalls keep the session open.
KEEPALIVE_S = 10
# The log follower checks this often whether the unit's waiter has exited; it then prints what is
# left of the log and ends by itself (no fixed grace sleep after the unit).
TAIL_CHECK_EVERY_S = 0.2

T = TypeVar("T")
LineSink = Callable[[str, str], None]  # (node name, line without newline)


@dataclass(frozen=True)
class CommandResult:
    node: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class RemoteError(DtlabError):
    """A node could not be reached or a command on it could not be run (not a non-zero exit)."""


def unit_name(cell_key: str, node_name: str) -> str:
    """systemd unit of one cell on one node; systemd allows [A-Za-z0-9:_.-] in names."""
    return f"{UNIT_PREFIX}{cell_key}-{node_name}"


# --- connections -----------------------------------------------------------------


def connect(node: Node, timeout: float = CONNECT_TIMEOUT_S):
    """A Fabric Connection to the node, with the inventory's user, port, key and known_hosts (strict)."""
    import paramiko
    from fabric import Config, Connection

    assert_safe_target(node.address)
    connect_kwargs: dict[str, Any] = {
        "allow_agent": False,
        "banner_timeout": timeout,
        "auth_timeout": timeout,
    }
    if node.ssh_key:
        key = Path(node.ssh_key).expanduser()
        if not key.exists():
            raise DtlabError(
                f"host {node.name}: ssh key {key} does not exist; fix ansible_ssh_private_key_file"
            )
        connect_kwargs.update(key_filename=[str(key)], look_for_keys=False)
    config = Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}})
    connection = Connection(
        host=node.address,
        user=node.ssh_user,
        port=node.ssh_port,
        config=config,
        connect_timeout=timeout,
        connect_kwargs=connect_kwargs,
    )
    # Host keys are checked like ansible.cfg's host_key_checking = True: unknown keys are refused.
    connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    if node.known_hosts_file:
        connection.client.load_host_keys(str(Path(node.known_hosts_file).expanduser()))
    else:
        with contextlib.suppress(OSError):
            connection.client.load_system_host_keys()
    return connection


def _open_with_keepalive(connection) -> None:
    connection.open()  # a no-op when already open; reconnects a connection whose transport died
    transport = connection.client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE_S)
        # A reused connection whose peer vanished (node down, link cut) would wait paramiko's default
        # hour to open the next channel; give up as fast as a fresh connect would.
        transport.channel_timeout = CONNECT_TIMEOUT_S


def _ssh_failed(node: Node, exc: BaseException) -> RemoteError:
    """paramiko/socket errors as one line that names the node."""
    detail = str(exc).splitlines()[0] if str(exc) else "no detail"
    return RemoteError(
        f"host {node.name} ({node.address}): ssh failed: {type(exc).__name__}: {detail}; is the node up "
        "(`invoke cluster.check`)?"
    )


class Sessions:
    """One SSH connection per node, shared by everything a cell does there: preflight, prepare, the
    log stream (a channel of its own), the result fetch and the cleanup. SSH multiplexes channels, so
    concurrent commands share the connection; each node pays one handshake per cell, not one per call.

    A connection is opened on first use (under a per-node lock, so two threads never open it twice)
    and reopened on the next use if it dropped. `close()` ends them all; use it as a context manager.
    """

    def __init__(self) -> None:
        self._connections: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def connection(self, node: Node):
        """The node's open connection (RemoteError if it cannot be opened)."""
        with self._guard:
            lock = self._locks.setdefault(node.name, threading.Lock())
        with lock:
            connection = self._connections.get(node.name)
            if connection is None:
                connection = self._connections[node.name] = connect(node)
            try:
                _open_with_keepalive(connection)
            except DtlabError:
                raise
            except Exception as exc:
                self._connections.pop(node.name, None)
                connection.close()
                raise _ssh_failed(node, exc) from None
            return connection

    def drop(self, node_name: str) -> None:
        """Close one node's connection (e.g. a stream hung on a cut link); the next use reconnects."""
        connection = self._connections.pop(node_name, None)
        if connection is not None:
            connection.close()

    def close(self) -> None:
        for name in list(self._connections):
            self.drop(name)

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# systemd's ActiveStates of a unit that runs or is on its way there; any other (inactive, failed,
# deactivating) will not bring its daemon back by itself.
RUNNING_OR_STARTING = ("active", "activating", "reloading")


def unit_state(node: Node, unit: str, *, timeout: float, connection=None) -> str:
    """systemd's ActiveState of the unit (active, activating, inactive, failed, ...);
    RemoteError when the node does not answer within `timeout` s."""
    answer = run(node, f"systemctl show -p ActiveState --value {shlex.quote(unit + '.service')}",
                 timeout=timeout, connection=connection)
    if answer.exit_code == 124:
        raise RemoteError(f"host {node.name}: no answer within {timeout:.0f} s")
    return answer.stdout.strip() or "unknown"


def _as_root(node: Node, command: str) -> str:
    """systemd-run and systemctl need root; a non-root inventory user goes through sudo -n."""
    if node.ssh_user == "root":
        return command
    return f"sudo -n sh -c {shlex.quote(command)}"


class _LineWriter:
    """File-like sink for Fabric's output: split into lines, prefix by node, copy to a log file."""

    def __init__(self, node: str, sink: LineSink | None, log_file: Path | None):
        self.node = node
        self.sink = sink
        self.buffer = ""
        self.lines: list[str] = []
        self.log = open(log_file, "a", encoding="utf-8") if log_file else None  # noqa: SIM115

    def write(self, chunk: str) -> int:
        self.buffer += chunk
        *complete, self.buffer = self.buffer.split("\n")
        for line in complete:
            self._emit(line.rstrip("\r"))
        return len(chunk)

    def _emit(self, line: str) -> None:
        self.lines.append(line)
        del self.lines[:-200]  # only the tail is ever reported
        if self.log:
            self.log.write(line + "\n")
            self.log.flush()
        if self.sink:
            self.sink(self.node, line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.buffer:
            self._emit(self.buffer)
            self.buffer = ""
        if self.log:
            self.log.close()
            self.log = None


def run(
    node: Node,
    command: str,
    *,
    timeout: float = COMMAND_TIMEOUT_S,
    root: bool = True,
    sink: LineSink | None = None,
    log_file: Path | None = None,
    connection=None,
    sessions: Sessions | None = None,
) -> CommandResult:
    """Run a shell command on the node; a non-zero exit is a result, not an exception.

    Over `connection`, or the node's connection in `sessions`, or else a connection of its own."""
    from invoke.exceptions import CommandTimedOut

    if connection is None and sessions is not None:
        connection = sessions.connection(node)
    own_connection = connection is None
    connection = connection or connect(node)
    writer = _LineWriter(node.name, sink, log_file) if (sink or log_file) else None
    try:
        _open_with_keepalive(connection)
        kwargs: dict[str, Any] = {"warn": True, "timeout": timeout, "in_stream": False}
        if writer:
            kwargs.update(hide=False, out_stream=writer, err_stream=writer)
        else:
            kwargs.update(hide=True)
        result = connection.run(_as_root(node, command) if root else command, **kwargs)
        return CommandResult(node.name, result.exited, result.stdout, result.stderr)
    except CommandTimedOut:
        tail = "\n".join(writer.lines[-5:]) if writer else ""
        return CommandResult(node.name, TIMED_OUT, tail, f"timed out after {timeout:.0f} s")
    except DtlabError:
        raise
    except Exception as exc:  # paramiko/socket errors: one line that names the node
        if sessions is not None and not own_connection:
            sessions.drop(node.name)  # a broken transport: the next use reconnects
        raise _ssh_failed(node, exc) from None
    finally:
        if writer:
            writer.close()
        if own_connection:
            connection.close()


def fan_out(
    nodes: Iterable[Node], action: Callable[[Node], T], max_workers: int = 16
) -> dict[str, T | BaseException]:
    """Run action(node) on every node at once; each node's value, or the exception it raised."""
    nodes = list(nodes)
    if not nodes:
        return {}
    results: dict[str, T | BaseException] = {}
    with ThreadPoolExecutor(max_workers=min(max_workers, len(nodes)), thread_name_prefix="dtlab-ssh") as pool:
        futures = {node.name: pool.submit(action, node) for node in nodes}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as exc:
                results[name] = exc
    return results


def run_all(nodes: Iterable[Node], command: str, **kwargs) -> dict[str, CommandResult | BaseException]:
    return fan_out(nodes, lambda node: run(node, command, **kwargs))


# --- named units -------------------------------------------------------------------


@dataclass(frozen=True)
class UnitSpec:
    """One process to start as a transient unit on one node."""

    unit: str
    argv: Sequence[str]
    log_path: str  # on the node
    user: str | None = None  # run as this user (None = root)
    workdir: str | None = None
    env: Mapping[str, str] | None = None
    environment_files: Sequence[str] = ()  # on the node; systemd reads them into the unit's environment
    runtime_max_s: int | None = None  # systemd kills it after this, even if the controller is gone


def unit_script(spec: UnitSpec) -> str:
    """Shell that starts the unit, follows its log until it ends, and exits with the unit's status."""
    properties = [
        f"StandardOutput=append:{spec.log_path}",
        f"StandardError=append:{spec.log_path}",
        "KillMode=control-group",
        "TimeoutStopSec=15",
    ]
    if spec.user:
        properties.append(f"User={spec.user}")
    if spec.workdir:
        properties.append(f"WorkingDirectory={spec.workdir}")
    if spec.runtime_max_s:
        properties.append(f"RuntimeMaxSec={int(spec.runtime_max_s)}")
    properties += [f"EnvironmentFile={path}" for path in spec.environment_files]
    start = ["systemd-run", "--quiet", "--collect", "--wait", f"--unit={spec.unit}"]
    start += [f"--property={p}" for p in properties]
    start += [f"--setenv={k}={v}" for k, v in (spec.env or {}).items()]
    start += ["--", *spec.argv]
    log_dir = str(Path(spec.log_path).parent)
    owner = (
        f"chown {shlex.quote(spec.user)} {shlex.quote(log_dir)} {shlex.quote(spec.log_path)}; "
        if spec.user
        else ""
    )
    # systemd-run --wait returns the unit's exit status; the unit outlives this shell if SSH drops.
    return (
        f"mkdir -p {shlex.quote(log_dir)}; : > {shlex.quote(spec.log_path)}; {owner}"
        f"systemctl reset-failed {shlex.quote(spec.unit + '.service')} 2>/dev/null; "
        f"{shlex.join(start)} & waiter=$!; "
        # --pid=$waiter: once systemd-run returns (the unit ended, or something killed it), tail prints
        # what is left of the log and exits by itself; so the stream ends with the unit, with every
        # line and no fixed grace sleep, and no orphaned follower holds the SSH channel open.
        f"tail -n +1 -F -s {TAIL_CHECK_EVERY_S} --pid=$waiter {shlex.quote(spec.log_path)} 2>/dev/null "
        "& tailer=$!; "
        "wait $waiter; status=$?; wait $tailer; exit $status"
    )


def run_unit(
    node: Node,
    spec: UnitSpec,
    *,
    timeout: float,
    sink: LineSink | None = None,
    log_file: Path | None = None,
    connection=None,
    sessions: Sessions | None = None,
) -> CommandResult:
    """Start the unit on the node and stream its log until it ends (or `timeout` passes)."""
    return run(node, unit_script(spec), timeout=timeout, sink=sink, log_file=log_file, connection=connection,
               sessions=sessions)


def stop_units(
    node: Node,
    patterns: str | Sequence[str] = CELL_UNIT_PATTERNS,
    timeout: float = 60,
    sessions: Sessions | None = None,
) -> CommandResult:
    """Stop every matching cell unit on the node and forget failed ones; safe when none runs."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    quoted = " ".join(shlex.quote(p + ".service") for p in patterns)
    command = (
        f"systemctl stop {quoted} 2>/dev/null; systemctl kill --signal=SIGKILL {quoted} 2>/dev/null; "
        f"systemctl reset-failed {quoted} 2>/dev/null; "
        f"systemctl list-units --all --plain --no-legend {quoted} | awk '{{print $1}}'"
    )
    return run(node, command, timeout=timeout, sessions=sessions)


def kill_by_pid_files(python: str, pid_files: str) -> str:
    """Shell that SIGKILLs the processes whose PIDs lie in `pid_files` (a glob, expanded by the shell),
    each checked first to be `python`'s executable: a finished process's PID may have been reused.
    Leaves the killed PIDs in $killed."""
    return (f"want=$(readlink -f {shlex.quote(python)}); killed=; for file in {pid_files}; do "
            '[ -f "$file" ] || continue; pid=$(cat "$file"); '
            '[ "$(readlink -f /proc/$pid/exe 2>/dev/null)" = "$want" ] && kill -9 "$pid" '
            '&& killed="$killed $pid"; done')


def running_units(node: Node, patterns: Sequence[str] = CELL_UNIT_PATTERNS) -> list[str]:
    quoted = " ".join(shlex.quote(p + ".service") for p in patterns)
    result = run(
        node,
        f"systemctl list-units --plain --no-legend --state=active,activating {quoted} | awk '{{print $1}}'",
    )
    return [line for line in result.stdout.split() if line]


# --- files -------------------------------------------------------------------------


def fetch_text(
    node: Node, remote_path: str, *, timeout: float = COMMAND_TIMEOUT_S, sessions: Sessions | None = None
) -> str | None:
    """The content of a file on the node, or None if it does not exist."""
    result = run(node, f"cat {shlex.quote(remote_path)} 2>/dev/null", timeout=timeout, sessions=sessions)
    return result.stdout if result.ok else None


def put_file(node: Node, local_path: Path, remote_path: str, connection=None) -> None:
    """Upload one file with Fabric's sftp (to a path the SSH user may write, e.g. /tmp)."""
    own = connection is None
    connection = connection or connect(node)
    try:
        connection.put(str(local_path), remote=remote_path)
    except Exception as exc:
        raise RemoteError(f"host {node.name}: upload of {local_path.name} failed: {exc}") from None
    finally:
        if own:
            connection.close()
