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

INVENTORY_HELP = "inventory to target (default: ansible.cfg's `inventory =`, i.e. the local lab)"


def _harness_call(function, *args, **kwargs):
    """Run harness logic; a DtlabError is one line on stderr, Ctrl-C exits 130, nothing else is caught."""
    from dtlab.errors import DtlabError

    try:
        return function(*args, **kwargs)
    except DtlabError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(getattr(error, "exit_code", DtlabError.exit_code) or 0)
    except KeyboardInterrupt:
        sys.exit(130)


def _cluster_check(inventory):
    from dtlab import cluster
    from dtlab.inventory import load_cluster

    cluster.check_or_raise(load_cluster(inventory))


def _cluster_reset(inventory):
    from dtlab import cluster
    from dtlab.inventory import load_cluster
    from dtlab.results import ResultStore

    target = load_cluster(inventory)
    recorded = {run.cell_key for run in ResultStore.for_cluster(target.name).runs(status="ok")} \
        if ResultStore.for_cluster(target.name).exists() else set()
    rows = cluster.reset(target, recorded_cells=recorded)
    cluster.render(rows, target)
    if cluster.failed(rows):
        raise cluster.ClusterUnhealthy(f"cluster.reset: done, but {len(cluster.failed(rows))} check(s) fail")


@task(name="check", help={"inventory": INVENTORY_HELP})
def cluster_check(c, inventory=None):
    """SSH, GPUs, identical trainer env, Spark, Determined, PostgreSQL, clock skew, disk: one table."""
    _harness_call(_cluster_check, inventory)


@task(name="reset", help={"inventory": INVENTORY_HELP})
def cluster_reset(c, inventory=None):
    """Stop every dtlab run, restart Spark/Determined, clear unfinished scratch; ends with cluster.check."""
    _harness_call(_cluster_reset, inventory)


# --- trainer -----------------------------------------------------------------


@task(name="deploy", help={"inventory": INVENTORY_HELP})
def trainer_deploy(c, inventory=None):
    """Push the trainer code to every node, check identical envs, build the Docker image where chosen."""
    from dtlab.deploy import deploy
    from dtlab.inventory import load_cluster

    _harness_call(lambda: deploy(load_cluster(inventory)))


# --- bench -------------------------------------------------------------------

BENCH_HELP = {
    "inventory": INVENTORY_HELP,
    "profile": "matrix profile from experiments/matrix.yml (default: its default_profile, smoke)",
    "only": "run only matching cells, comma-separated: ddp, g2, spark-g1, ddp-g*-e20-s1",
    "force": "rerun cells already recorded for the same config hash",
    "retries": "retries of a failed cell, resuming from its checkpoint (default 1)",
    "timeout": "seconds per cell (default: the profile's timeout_s)",
    "verbose": "stream every log line, not only epochs and errors",
    "matrix": "matrix file (default experiments/matrix.yml)",
    "report": "write the report at the end (default: yes)",
}


def _bench_options(profile, only, force, retries, timeout, verbose, matrix, report=True):
    from dtlab.bench import BenchOptions
    from dtlab.errors import DtlabError

    try:
        retries, timeout = int(retries), (int(timeout) if timeout not in (None, "") else None)
    except ValueError:
        raise DtlabError(f"--retries {retries} / --timeout {timeout}: must be whole numbers") from None
    return BenchOptions(profile=profile, only=only, force=force, retries=retries, timeout_s=timeout,
                        verbose=verbose, matrix_path=Path(matrix) if matrix else None, report=report)


@task(name="all", help=BENCH_HELP)
def bench_all(c, inventory=None, profile=None, only=None, force=False, retries=1, timeout=None, verbose=False,
              matrix=None, report=True):
    """Run the whole matrix over SSH in a stable order (resumable), then write the report."""
    from dtlab.bench import all_command

    options = _harness_call(_bench_options, profile, only, force, retries, timeout, verbose, matrix, report)
    outcomes = _harness_call(all_command, inventory, options)
    sys.exit(1 if any(outcome.status == "failed" for outcome in outcomes) else 0)


@task(name="run", help={"cell": "cell key, e.g. ddp-g2-e2-s0 (see bench.all's list)",
                        **{k: v for k, v in BENCH_HELP.items() if k not in ("only", "force", "report")}})
def bench_run(c, cell, inventory=None, profile=None, retries=1, timeout=None, verbose=False, matrix=None):
    """Run one matrix cell now (even if recorded) and record it."""
    from dtlab.bench import run_command

    options = _harness_call(_bench_options, profile, None, True, retries, timeout, verbose, matrix, False)
    outcome = _harness_call(run_command, inventory, cell, options)
    sys.exit(0 if outcome.status == "ok" else 1)


@task(name="report", help={
    "inventory": INVENTORY_HELP,
    "results_dir": "results folder to read instead of results/<cluster name>",
    "out": "folder to write the report to (default: <results folder>/report)",
    "profile": "matrix profile to report (default: that of the newest successful run)",
    "study": "render the report from the study's published runs alone (default out: results/study-report)"})
def bench_report(c, inventory=None, results_dir=None, out=None, profile=None, study=False):
    """Regenerate the study's Tables 5.1-5.9 and Figure 5.1 from the results store, beside the study's."""
    import dtlab.report

    _harness_call(dtlab.report.report_command, inventory=inventory, results_dir=results_dir, out=out,
                  profile=profile, study=study)


# --- top level ---------------------------------------------------------------

# lint-imports: the layer contracts in pyproject.toml ([tool.importlinter]), no import cycles.
LINTERS = ("ruff check .", "lint-imports", "yamllint -s .", "ansible-lint --profile production --offline")


# The inner loop: no lab, no Spark cluster, nothing marked slow (see README "Tests" for durations).
FAST_TESTS = "-m 'not lab and not slow'"


@task(help={"lint": "run ruff, yamllint and ansible-lint first (default: yes)",
            "fast": "the inner loop: skip the lab, the Spark cluster and every slow test (a few minutes)",
            "pytest_args": "extra pytest arguments, e.g. '-k report -x'"})
def test(c, lint=True, fast=False, pytest_args=""):
    """Lint, then run the whole test suite (this is what CI runs); --fast for the inner loop."""
    if lint:
        for command in LINTERS:
            c.run(command, echo=True)
    c.run(f"pytest {FAST_TESTS if fast else ''} {pytest_args}".strip(), echo=True, pty=False)


def _demo(name):
    import dtlab.lab
    from dtlab.bench import BenchOptions, all_command
    from dtlab.deploy import deploy
    from dtlab.inventory import load_cluster

    config = dtlab.lab.up(name)
    inventory = str(config.inventory_path)
    print(f"demo 1/4: lab {config.name} up ({inventory}); provisioning with ansible-playbook site.yml")
    from dtlab.errors import DtlabError
    from dtlab.provision import converge

    converged = converge(inventory, progress=print)
    if not converged.ok:
        raise DtlabError(f"demo: site.yml did not converge: {converged.summary()}")
    print(f"provisioned: {converged.summary()}")
    print("demo 2/4: trainer.deploy")
    deploy(load_cluster(inventory))
    print("demo 3/4: bench.all --profile smoke (then 4/4: the report)")
    all_command(inventory, BenchOptions(profile="smoke"))


@task(help={"name": LAB_NAME_HELP})
def demo(c, name=None):
    """lab.up, ansible-playbook site.yml, trainer.deploy, bench.all --profile smoke, then the report."""
    _harness_call(_demo, name)


lab = Collection("lab", lab_up, lab_down, lab_status, lab_ssh, lab_restart_node)
cluster = Collection("cluster", cluster_check, cluster_reset)
trainer = Collection("trainer", trainer_deploy)
bench = Collection("bench", bench_all, bench_run, bench_report)

ns = Collection(lab, cluster, trainer, bench, test, demo)
