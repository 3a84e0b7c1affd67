"""Lab nodes: a root per node (overlay on the image), first-boot seeding, and systemd-nspawn by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from dtlab.errors import DtlabError
from dtlab.lab import mounts
from dtlab.lab.config import LabConfig
from dtlab.lab.host import overlay_supported, run
from dtlab.lab.state import LabState
from dtlab.waiting import wait_until

STOP_GRACE_S = 10
READY_TIMEOUT_S = 120
# nspawn processes this Python process started: reaped here so a stopped one does not linger as a zombie.
_children: dict[int, subprocess.Popen] = {}


# --- the node's root ----------------------------------------------------------
def root_dir(config: LabConfig, node: str) -> Path:
    return config.node_dir(node) / "root"


def ensure_root(config: LabConfig, state: LabState, node: str, image: Path) -> tuple[Path, bool]:
    """Mount (or copy) the node's root; return it and whether the node is new (needs seeding)."""
    node_dir = config.node_dir(node)
    root = root_dir(config, node)
    record = state.node(node)
    is_new = not (node_dir / "seeded").exists()
    if is_new or "image" not in record:
        record["image"] = str(image)
    lower = Path(record["image"])
    if not lower.is_dir():
        raise DtlabError(f"lab {config.name}: {node} was built on image {lower}, which is gone;"
                         f" run `invoke lab.down --wipe --name {config.name}` and `lab.up` again")
    mode = record.get("root_mode") or ("overlay" if overlay_supported() else "copy")
    if mode == "overlay" and not mounts.is_mounted(root):
        for part in ("upper", "work", "root"):
            (node_dir / part).mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={lower},upperdir={node_dir / 'upper'},workdir={node_dir / 'work'}"
        result = run(["mount", "-t", "overlay", "overlay", "-o", options, str(root)], check=False)
        if result.returncode != 0:
            if not is_new:
                raise DtlabError(f"lab {config.name}: cannot mount {node}'s overlay root"
                                 f" ({result.stderr.strip()});"
                                 f" run `invoke lab.down --wipe --name {config.name}` and retry")
            print(f"lab: overlay mount failed ({result.stderr.strip()}); copying the image for {node}")
            mode = "copy"
    if mode == "copy" and not (node_dir / "copied").exists():
        mounts.remove_tree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        run(["cp", "-a", str(lower), str(root)], timeout=900)
        (node_dir / "copied").write_text("")
    record["root_mode"] = mode
    state.save()
    return root, is_new


# --- seeding ------------------------------------------------------------------
def seed_new_node(config: LabConfig, node: str, root: Path) -> None:
    """First creation only: identity and /etc/hosts. Later ups never rewrite what Ansible may manage."""
    (root / "etc/hostname").write_text(node + "\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    host_lines = [f"{config.node_address(name)}\t{name}" for name in config.node_names]
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                                    + "\n".join(host_lines) + "\n")
    # The node's own host key, made here so the controller knows it before the first connection (no TOFU).
    host_key = root / "etc/ssh/ssh_host_ed25519_key"
    for stale in (host_key, host_key.with_suffix(".pub")):
        stale.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{node}", "-f", str(host_key)])
    (root / "etc/ssh/sshd_config.d/dtlab-lab.conf").write_text(
        "# dtlab lab: the node has only the host key made at creation (known to the controller).\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n")
    (config.node_dir(node) / "seeded").write_text("")


def refresh_node(config: LabConfig, root: Path, public_key: str) -> None:
    """Every up: the lab key may log in as root, and apt goes through this lab's proxy."""
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    authorized = ssh_dir / "authorized_keys"
    lines = authorized.read_text().splitlines() if authorized.exists() else []
    if public_key not in lines:
        with open(authorized, "a") as keys:
            keys.write(public_key + "\n")
    authorized.chmod(0o600)
    (root / "etc/apt/apt.conf.d/00dtlab-lab-proxy").write_text(
        f'# dtlab lab: the nodes have no route out; apt goes through the lab proxy on the bridge.\n'
        f'Acquire::http::Proxy "{config.apt_proxy_url}";\n')


def host_public_key(config: LabConfig, node: str, root: Path) -> str:
    """The node's host key, made at its creation; a root that lost it cannot be trusted over SSH."""
    key_file = root / "etc/ssh/ssh_host_ed25519_key.pub"
    try:
        return key_file.read_text().split(" root@")[0].strip()
    except OSError:
        raise DtlabError(f"lab {config.name}: {node} was created but its root has no host key ({key_file});"
                         f" run `invoke lab.down --wipe --name {config.name}` and `lab.up` again") from None


# --- the nspawn process -------------------------------------------------------
def pid_file(config: LabConfig, node: str) -> Path:
    return config.node_dir(node) / "nspawn.pid"


def running_pid(config: LabConfig, node: str) -> int | None:
    """PID of this node's nspawn if it is alive (checked against its command line, not just the number)."""
    try:
        pid = int(pid_file(config, node).read_text())
    except (OSError, ValueError):
        return None
    return pid if _is_node_process(pid, root_dir(config, node)) else None


def _is_node_process(pid: int, root: Path) -> bool:
    child = _children.get(pid)
    if child is not None:
        # Started here: its exit status is the truth. Its command line is not: while the PID execs
        # ip netns exec -> sh (NODE_SUPERVISOR), /proc/PID/cmdline can read empty for an instant, and a boot
        # wait that looked then took a booting node for a dead one ("stopped while booting").
        return child.poll() is None and str(root) in child.args
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # The PID is `ip netns exec`, then NODE_SUPERVISOR's sh, with nspawn's argv as its arguments.
    return _state(pid) not in ("Z", None) and b"systemd-nspawn" in argv and str(root).encode() in argv


def _reap(pid: int) -> None:
    child = _children.get(pid)
    if child is not None:
        child.poll()  # collects its exit status (kept for console_tail)


# --- cgroups -------------------------------------------------------------------
CGROUP_FS = Path("/sys/fs/cgroup")


def _cgroup_hierarchies() -> list[Path]:
    """Where systemd in a node keeps its cgroups: the v2 tree, or name=systemd + unified (hybrid)."""
    if (CGROUP_FS / "cgroup.controllers").exists():
        return [CGROUP_FS]
    hybrid = [CGROUP_FS / "systemd", CGROUP_FS / "unified"]
    return [hierarchy for hierarchy in hybrid if (hierarchy / "cgroup.procs").exists()]


def node_cgroups(config: LabConfig, node: str) -> list[Path]:
    return [hierarchy / "dtlab" / f"{config.name}-{node}" for hierarchy in _cgroup_hierarchies()]


def _cgroup_tree(cgroup: Path) -> list[Path]:
    """The cgroup and every cgroup below it, deepest first. The node's systemd creates and removes
    session scopes while we walk, so a directory that vanishes mid-walk is skipped, not an error
    (os.walk ignores it; Path.rglob raised FileNotFoundError)."""
    return [Path(directory) for directory, _, _ in os.walk(cgroup, topdown=False)]


def remove_cgroups(config: LabConfig, node: str) -> None:
    """rmdir the node's (empty) cgroups, deepest first; a cgroup still holding a process stays."""
    for cgroup in node_cgroups(config, node):
        for directory in _cgroup_tree(cgroup):
            with contextlib.suppress(OSError):
                directory.rmdir()


def cgroup_pids(config: LabConfig, node: str) -> set[int]:
    """Every process in the node's cgroups: its nspawn and, inside, the node's systemd and services."""
    pids: set[int] = set()
    for cgroup in node_cgroups(config, node):
        for directory in _cgroup_tree(cgroup):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in (directory / "cgroup.procs").read_text().split())
    return {pid for pid in pids if _state(pid) not in ("Z", None)}  # zombies are gone, just unreaped


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def kill_remnants(config: LabConfig, node: str, timeout: float = STOP_GRACE_S) -> None:
    """SIGKILL, by PID, whatever still runs in the node's cgroups. A killed nspawn leaves its node
    running (systemd, sshd on the node's address); killing the node's PID 1 ends its PID namespace."""

    def none_left() -> bool:
        pids = cgroup_pids(config, node)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
            _reap(pid)
        return not pids

    wait_until(none_left, timeout_s=timeout, every_s=0.05)
    if cgroup_pids(config, node):  # the last SIGKILLs may have landed after the last look
        raise DtlabError(f"lab {config.name}: processes of {node} survive SIGKILL"
                         f" (pids {sorted(cgroup_pids(config, node))[:5]}); check `ps` and retry")


# Puts nspawn in the node's own cgroups before it starts (it keeps its cgroup, --keep-unit); otherwise all
# nodes on the host share /payload and tear down each other's cgroups. A shell that moves itself, then execs
# the rest: no Python runs between fork and exec (a preexec_fn there crashed the harness's child processes
# while other threads ran: Python documents it unsafe with threads). Arguments: CGROUP... -- COMMAND...
ENTER_CGROUPS = ('while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 1; shift; done; '
                 'shift; exec "$@"')


# The shell that runs a node's nspawn: it mounts the cgroup2 hierarchy (above), and boots the node again
# when its systemd reboots (nspawn's exit 133, as systemd-nspawn@.service's RestartForceExitStatus=133
# does), so `reboot` on a node, or Ansible's reboot module, returns as on a VM. SIGTERM goes on to nspawn
# (a clean poweroff) and ends the loop. Reboots are bounded: a node that reboots in a loop stops.
MAX_REBOOTS = 50
NODE_SUPERVISOR = f"""mount -t cgroup2 cgroup2 /sys/fs/cgroup || exit 1
boots=0 stopping= node=
trap 'stopping=1; [ -n "$node" ] && kill -TERM "$node" 2>/dev/null' TERM INT
while :; do
  "$@" &
  node=$!
  rc=
  while [ -z "$rc" ]; do wait "$node"; rc=$?; kill -0 "$node" 2>/dev/null && rc=; done
  [ "$rc" -eq 133 ] && [ -z "$stopping" ] && [ "$boots" -lt {MAX_REBOOTS} ] || exit "$rc"
  boots=$((boots + 1))
  echo "--- $(date '+%F %T') the node rebooted (nspawn exit 133): boot $((boots + 1))"
done"""


def start(config: LabConfig, node: str, root: Path, binds: dict[str, str],
          writable_binds: dict[str, str] | None = None) -> int:
    """Boot the node in the background (it outlives this process); its console goes to console.log.
    `binds` are mounted read-only, `writable_binds` read-write: host directory -> node directory."""
    nspawn = ["systemd-nspawn", "--boot", "--register=no", "--keep-unit",
              # The machine name must be unique on the host (nspawn keys /run/systemd/nspawn/* on it).
              "-D", str(root), f"--machine={config.name}-{node}", f"--hostname={node}",
              "--resolv-conf=off", "--timezone=off", "--link-journal=no", "--console=passive",
              # The firewall role loads nftables rules in the node. CAP_NET_ADMIN acts only on the
              # network namespace the node runs in, its own (below), never on the host's.
              "--capability=CAP_NET_ADMIN"]
    # nspawn runs inside the node's netns, under `ip netns exec`, which mounts a sysfs of that netns: nspawn
    # passes /sys on to the node, so /sys/class/net (what Ansible's interface facts read) lists the node's
    # own interfaces, as on a VM. (--network-namespace-path would leave the host's there.) The fresh /sys
    # lacks the cgroup2 mount nspawn needs: NODE_SUPERVISOR mounts it again, the same hierarchy.
    argv = ["ip", "netns", "exec", config.netns_name(node), "sh", "-c", NODE_SUPERVISOR, "sh", *nspawn]
    for source in [*binds, *(writable_binds or {})]:
        Path(source).mkdir(parents=True, exist_ok=True)  # nspawn refuses to start on a missing source
    argv += [f"--bind-ro={source}:{target}" for source, target in sorted(binds.items())]
    argv += [f"--bind={source}:{target}" for source, target in sorted((writable_binds or {}).items())]
    kill_remnants(config, node)  # a node left running by a crashed nspawn would hold its address
    remove_cgroups(config, node)  # empty leftovers of the node's previous boot
    cgroups = node_cgroups(config, node)
    for cgroup in cgroups:
        cgroup.mkdir(parents=True, exist_ok=True)
    log_path = config.node_dir(node) / "console.log"
    with open(log_path, "ab") as log:
        log.write(f"\n--- {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
        log.flush()
        entering = ["sh", "-c", ENTER_CGROUPS, "sh", *(str(cgroup) for cgroup in cgroups), "--"]
        process = subprocess.Popen([*entering, *argv], stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    _children[process.pid] = process
    pid_file(config, node).write_text(f"{process.pid}\n")
    return process.pid


def stop(config: LabConfig, nodes: list[str]) -> None:
    """SIGTERM each node's supervisor (on to nspawn: a clean poweroff), wait a bounded time, then SIGKILL
    by PID."""
    pids = {node: pid for node in nodes if (pid := running_pid(config, node))}

    def all_exited() -> bool:
        return not any(running_pid(config, node) for node in pids)

    for pid in pids.values():
        _signal(pid, signal.SIGTERM)
    wait_until(all_exited, timeout_s=STOP_GRACE_S, every_s=0.05)
    for node, pid in pids.items():
        if running_pid(config, node):
            print(f"lab: {node} did not power off in {STOP_GRACE_S} s; killing nspawn {pid}")
            _signal(pid, signal.SIGKILL)
    wait_until(all_exited, timeout_s=STOP_GRACE_S, every_s=0.05)
    for node in nodes:
        if running_pid(config, node):
            raise DtlabError(f"lab {config.name}: {node} (nspawn pid {running_pid(config, node)}) survives"
                             " SIGKILL; check `ps` and retry")
        kill_remnants(config, node)
        pid_file(config, node).unlink(missing_ok=True)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def console_tail(config: LabConfig, node: str, lines: int = 3) -> str:
    """The last lines of the node's console log since its last start, and nspawn's exit status."""
    log_path = config.node_dir(node) / "console.log"
    text = log_path.read_text(errors="replace").rsplit("\n--- ", 1)[-1] if log_path.exists() else ""
    tail = [line for line in text.splitlines()[1:] if line.strip()][-lines:]
    root = str(root_dir(config, node))
    this_node = [child for child in _children.values() if root in child.args][-1:]
    exits = [f"nspawn exit {child.returncode}" for child in this_node if child.poll() is not None]
    return " | ".join(tail + exits) or "no console output"


def processes_using(directory: Path) -> list[tuple[int, str]]:
    """Live processes whose command line names a path under `directory` (e.g. a node's nspawn)."""
    marker = str(directory).encode() + b"/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            status = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in argv and status != "Z":
            found.append((int(entry.name), argv.replace(b"\0", b" ").decode(errors="replace")[:120]))
    return found
