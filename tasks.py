"""dtlab's Invoke entry point: declarations only; the logic lives in the `dtlab` package.

    invoke --list            the manual
    invoke lab.up            the local three-node lab (the default target)
    invoke bench.all         the benchmark matrix over SSH
    invoke cluster.reset     back to a clean, known state
"""

import os
import sys
from pathlib import Path

from invoke import Collection, task

# Tools installed beside this interpreter (ansible-playbook, pytest, ruff) win over any on PATH,
# so `.venv/bin/invoke ...` works without activating the venv.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

# --- lab ---------------------------------------------------------------------

LAB_NAME_HELP = "lab instance (default: $DTLAB_LAB_NAME or 'dtlab'; others get inventory/lab-<name>.yml)"


def _lab_call(function, *args, **kwargs):
    """Run a dtlab.lab function; a DtlabError becomes one line on stderr and exit code 2."""
    from dtlab.errors import DtlabError

    try:
        return function(*args, **kwargs)
    except DtlabError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(DtlabError.exit_code)


@task(name="up", help={"name": LAB_NAME_HELP, "nodes": "node count (default: lab_node_count)",
                       "subnet": "the lab's /24 inside 10.213.0.0/16 (default: from the name)"})
def lab_up(c, name=None, nodes=None, subnet=None):
    """Start the local lab (builds the node image once); idempotent. Needs root."""
    import dtlab.lab

    config = _lab_call(dtlab.lab.up, name, node_count=int(nodes) if nodes else None, subnet=subnet)
    print(f"lab {config.name} up: {', '.join(f'{n}={config.node_address(n)}' for n in config.node_names)};"
          f" inventory {config.inventory_path}")


@task(name="down", help={"name": LAB_NAME_HELP, "wipe": "also delete node state (the image cache stays)"})
def lab_down(c, name=None, wipe=False):
    """Stop the lab's nodes and remove its namespaces, mounts and links. Needs root."""
    import dtlab.lab

    config = _lab_call(dtlab.lab.down, name, wipe=wipe)
    print(f"lab {config.name} down{' and wiped' if wipe else ''}")


@task(name="status", help={"name": LAB_NAME_HELP})
def lab_status(c, name=None):
    """Show the guard route, bridge, apt proxy and each node's state."""
    import dtlab.lab

    report = _lab_call(dtlab.lab.status, name)
    print(f"lab {report['name']}  subnet {report['subnet']}  guard: {report['guard']}")
    print(f"  bridge: {report['bridge'] or '-'}  apt proxy pid: {report['apt_proxy_pid'] or '-'}"
          f"  inventory: {report['inventory']}")
    for node, info in report["nodes"].items():
        print(f"  {node:8} {info['address']:15} pid {info['pid'] or '-':<8} {info.get('systemd', 'down')}")


@task(name="ssh", help={"node": "node name, e.g. node0", "name": LAB_NAME_HELP,
                        "command": "run this instead of a login shell"})
def lab_ssh(c, node, name=None, command=None):
    """Open a root shell on a lab node (over SSH with the lab key, like Ansible does)."""
    import dtlab.lab

    argv = _lab_call(dtlab.lab.ssh_argv, node, *([command] if command else []), name=name, tty=not command)
    os.execvp(argv[0], argv)


@task(name="restart-node", help={"node": "node name, e.g. node1", "name": LAB_NAME_HELP})
def lab_restart_node(c, node, name=None):
    """Power one lab node off and on again; waits until it is ready."""
    import dtlab.lab

    _lab_call(dtlab.lab.restart_node, node, name)
    print(f"{node} restarted")



# --- cluster -----------------------------------------------------------------


# --- trainer -----------------------------------------------------------------


# --- bench -------------------------------------------------------------------

@task(name="report", help={
    "inventory": "inventory whose results to report (default: the one ansible.cfg names)",
    "results_dir": "results folder to read instead of results/<cluster name>",
    "out": "folder to write the report to (default: <results folder>/report)",
    "profile": "matrix profile to report (default: that of the newest successful run)"})
def bench_report(c, inventory=None, results_dir=None, out=None, profile=None):
    """Regenerate the study's Tables 5.1-5.9 and Figure 5.1 from the results store, beside the study's."""
    import dtlab.report

    _lab_call(dtlab.report.report_command, inventory=inventory, results_dir=results_dir, out=out, profile=profile)



# --- top level ---------------------------------------------------------------

LINTERS = ("ruff check .", "yamllint -s .", "ansible-lint --profile production --offline")


@task(help={"lint": "run ruff, yamllint and ansible-lint first (default: yes)",
            "pytest_args": "extra pytest arguments, e.g. '-k report -x'"})
def test(c, lint=True, pytest_args=""):
    """Lint, then run the whole test suite (this is what CI runs)."""
    if lint:
        for command in LINTERS:
            c.run(command, echo=True)
    c.run(f"pytest {pytest_args}", echo=True, pty=False)


lab = Collection("lab", lab_up, lab_down, lab_status, lab_ssh, lab_restart_node)
cluster = Collection("cluster")
trainer = Collection("trainer")
bench = Collection("bench", bench_report)

ns = Collection(lab, cluster, trainer, bench, test)
