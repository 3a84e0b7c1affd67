"""The local N-node lab: real Debian nodes (systemd-nspawn, real systemd and sshd) on one host.

    up(name)                  build/cache the image, start the nodes, wait for SSH, write the inventory
    down(name, wipe=False)    stop the nodes, unmount, delete the lab's netns/links, stop its apt proxy
    status(name)              what is up, as a dict
    restart_node(node, name)  power one node off and on again
    ssh_argv(node, *command)  the ssh command line for a node (checks the guard)
    assert_guard(name)        DtlabError unless the host blackholes the lab address range

Safety: every lab address lies in `lab_address_range`, which `up` blackholes on the host
before any lab address exists, so a packet for a lab that is down never leaves the machine.
See docs/lab.md.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from dtlab import paths
from dtlab.errors import DtlabError
from dtlab.lab import access, host, image, inventory, mounts, network, nodes, proxy
from dtlab.lab.config import DEFAULT_LAB_NAME, LabConfig, load_config
from dtlab.lab.state import LabState, instance_lock

__all__ = ["DEFAULT_LAB_NAME", "LabConfig", "assert_guard", "down", "load_config", "restart_node",
           "ssh_argv", "status", "up"]


def _config(name: str | None, node_count: int | None = None, subnet: str | None = None) -> LabConfig:
    """The instance as it was brought up (its state remembers --nodes/--subnet), else as configured."""
    config = load_config(name)
    recorded = LabState(config.run_dir).data
    if recorded.get("node_count") and node_count is None:
        node_count = recorded["node_count"]
    if recorded.get("subnet") and subnet is None:
        subnet = recorded["subnet"]
    config = load_config(name, node_count=node_count, subnet=subnet)
    shape = (recorded.get("node_count"), recorded.get("subnet"))
    if shape != (None, None) and shape != (config.node_count, str(config.subnet)):
        raise DtlabError(f"lab {config.name}: exists with {shape[0]} nodes on {shape[1]};"
                         f" run `invoke lab.down --wipe --name {config.name}` before changing its shape")
    return config


def up(name: str | None = None, node_count: int | None = None, subnet: str | None = None,
       binds: dict[str, str] | None = None, bundle: str | Path | None = None) -> LabConfig:
    """Bring the lab up (idempotent; recovers after a crash).

    `binds`: extra read-only bind mounts, host directory -> node directory (kept for restarts).
    `bundle`: an offline lab (docs/offline.md): no apt proxy, so the nodes have no way out at all; the
    bundle (invoke bundle.build) is mounted read-only at dtlab_bundle_dir and the lab's inventory names it
    (dtlab_bundle), so every `ansible-playbook site.yml` on this lab installs from it alone.
    """
    host.require_root()
    config = _config(name, node_count, subnet)
    offline = _offline_bundle(config, bundle)
    host.ensure_tools()
    host.require_kernel_features()
    host.raise_inotify_limits()
    with instance_lock(config.run_dir):
        state = LabState(config.run_dir)
        state.data.update(node_count=config.node_count, subnet=str(config.subnet))
        state.save()
        network.ensure_guard(config.address_range)  # before any lab address exists
        node_image = image.ensure_image(config)
        host.require_free_disk(config.run_dir, host.MIN_FREE_BYTES_UP)
        public_key = access.ensure_keypair(config)
        network.ensure_bridge(config, state)
        if offline:
            state.data["bundle"] = offline
            binds = {**(binds or {}), offline: config.bundle_mount}
        else:
            proxy.ensure_running(config)
        paths.WHEELHOUSE_DIR.mkdir(parents=True, exist_ok=True)
        state.data.setdefault("binds", {}).update(binds or {})
        state.save()
        node_binds = {str(paths.WHEELHOUSE_DIR): config.wheelhouse_mount, **state.data["binds"]}
        host_keys, to_start = {}, []
        for node in config.node_names:
            network.ensure_node_network(config, state, node)
            root = nodes.root_dir(config, node)
            if not nodes.running_pid(config, node):
                root, is_new = nodes.ensure_root(config, state, node, node_image)
                if is_new:
                    nodes.seed_new_node(config, node, root)
                to_start.append(node)
            nodes.refresh_node(config, root, public_key)  # also live: a running node's root is mounted here
            host_keys[node] = nodes.host_public_key(config, node, root)
        access.write_known_hosts(config, host_keys)
        for node in to_start:
            nodes.start(config, node, nodes.root_dir(config, node), node_binds, _shared_bind(config))
        access.wait_ready(config, config.node_names)
        inventory.write(config, bundle=offline)
    return config


def _offline_bundle(config: LabConfig, bundle: str | Path | None) -> str | None:
    """The bundle an offline lab mounts (absolute), or None for a lab with its apt proxy. `lab.up` without
    --bundle brings a lab up as it was made; another way needs `lab.down --wipe` first (the nodes would keep
    the other way's apt sources and venv)."""
    state = LabState(config.run_dir)
    recorded = state.data.get("bundle")
    if bundle is None:
        return recorded
    wanted = str(Path(bundle).resolve())
    if state.data.get("nodes") and wanted != recorded:
        was = f"offline from {recorded}" if recorded else "online (apt proxy)"
        raise DtlabError(f"lab {config.name}: exists {was}; run `invoke lab.down --wipe --name {config.name}`"
                         " before bringing it up another way")
    if not (Path(wanted) / "manifest.json").is_file():
        raise DtlabError(f"lab --bundle {bundle}: no manifest.json there; build one with"
                         f" `invoke bundle.build --out {bundle}`")
    return wanted


def down(name: str | None = None, wipe: bool = False) -> LabConfig:
    """Stop the lab and remove what it created (by name/PID); `wipe` also drops node state."""
    host.require_root()
    config = _config(name)
    with instance_lock(config.run_dir):
        state = LabState(config.run_dir)
        node_names = sorted(set(config.node_names) | set(state.data["nodes"]))
        nodes.stop(config, node_names)
        proxy.stop(config)
        for node in node_names:
            mounts.unmount_under(config.node_dir(node))
            nodes.remove_cgroups(config, node)
        network.remove_created(state)
        if wipe:
            for node in node_names:
                mounts.remove_tree(config.node_dir(node))
            mounts.remove_tree(config.shared_dir)  # the lab's "NFS": its checkpoints are lab state too
            state.data = {"created": state.data["created"], "nodes": {}}
            state.save()
            if not any(state.data["created"].values()):
                state.path.unlink()  # nothing of this lab is left to remember
    if wipe:
        _remove_empty_run_dir(config)
    return config


def _remove_empty_run_dir(config: LabConfig) -> None:
    """After a wipe, drop the instance's directory if only its lock and proxy log are left."""
    leftovers = {entry.name for entry in config.run_dir.iterdir()} if config.run_dir.is_dir() else set()
    if leftovers <= {".lock", "aptproxy.log"}:
        for name in leftovers:
            with contextlib.suppress(OSError):
                (config.run_dir / name).unlink()
        with contextlib.suppress(OSError):
            config.run_dir.rmdir()  # fails, harmlessly, if another command just started using it


def _shared_bind(config: LabConfig) -> dict[str, str]:
    """The lab's shared disk, read-write in every node: one host directory, open to every node's users
    (sticky, as /tmp: the trainer user's uid is the nodes' business); none if the lab sets no mount."""
    if not config.shared_checkpoint_mount:
        return {}
    config.shared_dir.mkdir(parents=True, exist_ok=True)
    config.shared_dir.chmod(0o1777)
    return {str(config.shared_dir): config.shared_checkpoint_mount}


def restart_node(node: str, name: str | None = None) -> None:
    """Power one node off (clean, bounded) and boot it again; waits until it is ready."""
    host.require_root()
    config = _config(name)
    config.node_index(node)  # validates the name
    with instance_lock(config.run_dir):
        state = LabState(config.run_dir)
        if not (config.node_dir(node) / "seeded").exists():
            raise DtlabError(f"lab {config.name}: {node} does not exist; run `invoke lab.up` first")
        network.assert_guard(config)
        nodes.stop(config, [node])
        node_image = state.node(node).get("image")
        root, _ = nodes.ensure_root(config, state, node, node_image)
        node_binds = {str(paths.WHEELHOUSE_DIR): config.wheelhouse_mount, **state.data.get("binds", {})}
        nodes.start(config, node, root, node_binds, _shared_bind(config))
        access.wait_ready(config, [node])


def status(name: str | None = None, probe: bool = True) -> dict:
    """The lab's state: guard, bridge, apt proxy, and each node (pid, address, systemd state over SSH)."""
    config = _config(name)
    guard = network.guard_present(config.address_range)
    report = {
        "name": config.name,
        "subnet": str(config.subnet),
        "inventory": str(config.inventory_path),
        "guard": f"blackhole {config.address_range}" if guard else "MISSING",
        "bridge": config.bridge_ifname if network.link_exists(config.bridge_ifname) else None,
        "apt_proxy_pid": proxy.running_pid(config),
        "bundle": LabState(config.run_dir).data.get("bundle"),
        "nodes": {},
    }
    for node in config.node_names:
        pid = nodes.running_pid(config, node)
        node_report = {"address": str(config.node_address(node)), "pid": pid,
                       "netns": network.netns_exists(config.netns_name(node)),
                       "root_mounted": mounts.is_mounted(nodes.root_dir(config, node))}
        if probe and pid and guard:
            node_report["systemd"] = access.node_state(config, node)
        report["nodes"][node] = node_report
    return report


def assert_guard(name: str | None = None) -> None:
    network.assert_guard(load_config(name))


def ssh_argv(node: str, *command: str, name: str | None = None, tty: bool = False) -> list[str]:
    return access.ssh_argv(_config(name), node, *command, tty=tty)


def leftovers(name: str | None = None) -> list[str]:
    """Anything of this lab still on the host (netns, links, mounts, processes); [] after a clean down."""
    config = _config(name)
    netns_names = os.listdir(network.NETNS_DIR) if network.NETNS_DIR.exists() else []
    found = [f"netns {ns}" for ns in netns_names if ns.startswith(f"dtlab-{config.name}-")]
    found += [f"link {link}" for link in (config.bridge_ifname,
                                          *(config.veth_host_ifname(node) for node in config.node_names))
              if network.link_exists(link)]
    found += [f"mount {point}" for point in mounts.mounts_under(config.run_dir)]
    found += [f"process {pid}: {command}" for pid, command in nodes.processes_using(config.run_dir)]
    found += [f"cgroup {cgroup}" for node in config.node_names for cgroup in nodes.node_cgroups(config, node)
              if cgroup.exists()]
    if proxy.running_pid(config):
        found.append(f"apt proxy pid {proxy.running_pid(config)}")
    return found
