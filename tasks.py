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
                       "subnet": "the lab's /24 inside 10.213.0.0/16 (default: from the name)",
                       "bundle": "an offline lab: no apt proxy, the nodes install from this bundle alone"
                                 " (invoke bundle.build; docs/offline.md)"})
def lab_up(c, name=None, nodes=None, subnet=None, bundle=None):
    """Start the local lab (builds the node image once); idempotent. Needs root."""
    import dtlab.lab

    config = _lab_call(dtlab.lab.up, name, node_count=int(nodes) if nodes else None, subnet=subnet,
                       bundle=bundle)
    print(f"lab {config.name} up: {', '.join(f'{n}={config.node_address(n)}' for n in config.node_names)};"
          f" inventory {config.inventory_path}")


@task(name="down", help={"name": LAB_NAME_HELP,
                         "wipe": "also delete node state and the shared disk (the image cache stays)"})
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
    if report["bundle"]:
        print(f"  offline: no way out, installs from the bundle {report['bundle']}")
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
        for line in str(error).splitlines():  # the health gate's refusal: one line per failure
            print(f"error: {line}", file=sys.stderr)
        sys.exit(getattr(error, "exit_code", DtlabError.exit_code) or 0)
    except KeyboardInterrupt:
        sys.exit(130)


@task(name="check", help={"inventory": INVENTORY_HELP})
def cluster_check(c, inventory=None):
    """SSH, GPUs, identical trainer env, Spark, Ray, Slurm, Determined, PostgreSQL, clock, disk: one table."""
    from dtlab import commands

    _harness_call(commands.cluster_check, inventory)


@task(name="doctor", help={"inventory": INVENTORY_HELP,
                           "json": "print one JSON document (a verdict per check, the failures, the "
                                   "all-reduce pairs) instead of the tables"})
def cluster_doctor(c, inventory=None, json=False):
    """bench.all's health gate: cluster.check and all-reduce between workers; exit 0 ok, 1 failed, 2 error."""
    from dtlab import commands

    _harness_call(commands.cluster_doctor, inventory, as_json=json)


@task(name="provision", help={"inventory": INVENTORY_HELP,
                              "check": "check mode: what would change (nothing is recorded)",
                              "diff": "show each file's changes", "tags": "only these stages, e.g. spark,ray",
                              "limit": "only these hosts (Ansible's --limit)"})
def cluster_provision(c, inventory=None, check=False, diff=False, tags="", limit=None):
    """ansible-playbook site.yml, a line per task; a whole run records its seconds per role (Table B.10)."""
    from dtlab.provision import provision_command

    _harness_call(provision_command, inventory, check=check, diff=diff, tags=tags, limit=limit)


@task(name="idle", help={"inventory": INVENTORY_HELP,
                         "seconds": "seconds between the two samples that CPU is measured over (default 10)"})
def cluster_idle(c, inventory=None, seconds=None):
    """Each platform daemon's memory and CPU per node with no cell running; recorded for Table B.10."""
    from dtlab.idle import idle_command

    _harness_call(idle_command, inventory, seconds)


@task(name="reset", help={"inventory": INVENTORY_HELP})
def cluster_reset(c, inventory=None):
    """Stop dtlab runs and Slurm jobs, restart Spark, Ray, Determined, clear scratch; ends with the check."""
    from dtlab import commands

    _harness_call(commands.cluster_reset, inventory)


# --- trainer -----------------------------------------------------------------


@task(name="deploy", help={"inventory": INVENTORY_HELP})
def trainer_deploy(c, inventory=None):
    """Push the trainer code to every node, check identical envs, build the Docker image where chosen."""
    from dtlab import commands

    _harness_call(commands.trainer_deploy, inventory)


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
    "skip_gate": "start without the health gate (cluster.doctor) and never drain a node a cell failed on",
}


@task(name="all", help=BENCH_HELP)
def bench_all(c, inventory=None, profile=None, only=None, force=False, retries=1, timeout=None, verbose=False,
              matrix=None, report=True, skip_gate=False):
    """The health gate, then the whole matrix over SSH in a stable order (resumable), then the report."""
    from dtlab import commands

    options = _harness_call(commands.bench_options, profile, only, force, retries, timeout, verbose, matrix,
                            report, skip_gate)
    outcomes = _harness_call(commands.bench_all, inventory, options)
    sys.exit(1 if any(outcome.status == "failed" for outcome in outcomes) else 0)


@task(name="run", help={"cell": "cell key, e.g. ddp-g2-e2-s0 (see bench.all's list)",
                        **{k: v for k, v in BENCH_HELP.items()
                           if k not in ("only", "force", "report")}})
def bench_run(c, cell, inventory=None, profile=None, retries=1, timeout=None, verbose=False, matrix=None,
              skip_gate=False):
    """Run one matrix cell now (even if recorded) and record it; the health gate first, as bench.all."""
    from dtlab import commands

    options = _harness_call(commands.bench_options, profile, None, True, retries, timeout, verbose, matrix,
                            False, skip_gate)
    outcome = _harness_call(commands.bench_run, inventory, cell, options)
    sys.exit(0 if outcome.status == "ok" else 1)


@task(name="faults", help={k: v for k, v in BENCH_HELP.items() if k != "profile"} | {
    "profile": "matrix profile with a fault plan (default: faults)"})
def bench_faults(c, inventory=None, profile="faults", only=None, force=False, retries=1, timeout=None,
                 verbose=False, matrix=None, report=True, skip_gate=False):
    """Fault recovery: each cell undisturbed, then with the profile's fault; the report's fault table."""
    from dtlab import commands

    options = _harness_call(commands.bench_options, profile, only, force, retries, timeout, verbose, matrix,
                            report, skip_gate)
    outcomes = _harness_call(commands.bench_all, inventory, options, needs_fault_plan=True)
    sys.exit(1 if any(outcome.status == "failed" for outcome in outcomes) else 0)


@task(name="report", help={
    "inventory": INVENTORY_HELP,
    "results_dir": "results folder to read instead of results/<cluster name>",
    "out": "folder to write the report to (default: <results folder>/report)",
    "profile": "matrix profile to report (default: that of the newest successful run)",
    "study": "render the report from the study's published runs alone (default out: results/study-report)",
    "priorities": "rank the platforms (Table B.11): criteria in order, e.g. speed,recovery,operations, or a "
                  "YAML file of criterion: weight (criteria: docs/results-and-report.md)"})
def bench_report(c, inventory=None, results_dir=None, out=None, profile=None, study=False, priorities=None):
    """Regenerate the study's Tables 5.1-5.9 and Figure 5.1 from the results store, beside the study's."""
    from dtlab import commands

    _harness_call(commands.bench_report, inventory=inventory, results_dir=results_dir, out=out,
                  profile=profile, study=study, priorities=priorities)


@task(name="compare", help={
    "a": "A: a results folder, or a cluster's name (results/<name>)",
    "b": "B: another results folder or cluster; the same as A with --revisions",
    "revisions": "R1,R2: A's runs recorded at dtlab revision R1 against B's at R2 (a prefix will do)",
    "profile": "only this matrix profile's runs, on both sides (default: the newest run of each cell)"})
def bench_compare(c, a, b, revisions=None, profile=None):
    """B's runs against A's, cell by cell (same config hash only), each figure's change; 1 on a regression."""
    from dtlab import commands

    compared = _harness_call(commands.bench_compare, a, b, revisions=revisions, profile=profile)
    sys.exit(1 if compared.regressions else 0)


@task(name="export", help={
    "cell": "the cell: a key without its seed, e.g. ddp-g2-e20 (its runs are the seeds Table B.7 scores)",
    "mlperf": "DIR: lay the runs out as MLPerf's result summarizer and compliance checker read them "
              "(results/<system>/bert/result_N.txt, systems/<system>.json, compliance/: MLPerf's training "
              "rules plus the profile's target; docs/results-and-report.md)",
    "inventory": INVENTORY_HELP,
    "results_dir": "results folder to read instead of results/<cluster name>",
    "profile": "matrix profile whose runs to export (default: that of the newest successful run)"})
def bench_export(c, cell, mlperf=None, inventory=None, results_dir=None, profile=None):
    """A cell's runs in MLPerf's log format, laid out for mlperf-logging's checker and summarizer."""
    from dtlab import commands

    _harness_call(commands.bench_export, cell, mlperf=mlperf, inventory=inventory, results_dir=results_dir,
                  profile=profile)


# --- bundle: everything the nodes install, for an offline cluster (docs/offline.md) ----------------------

BUNDLE_PARTS_HELP = "only these parts, comma-separated: wheels,apt,releases,hf,images (default: all)"


@task(name="build", help={"out": "the bundle's directory (created, or completed where it holds a bundle)",
                          "inventory": INVENTORY_HELP, "parts": BUNDLE_PARTS_HELP,
                          "profile": "matrix profiles whose models and data it holds, comma-separated"
                                     " (default: the matrix's default_profile)"})
def bundle_build(c, out, inventory=None, parts="", profile=""):
    """Write the offline bundle for the inventory's nodes: wheels, apt packages, releases, models and data."""
    from dtlab import bundle

    _harness_call(bundle.build_command, out, inventory, parts, profile)


@task(name="verify", help={"path": "the bundle's directory", "inventory": INVENTORY_HELP})
def bundle_verify(c, path, inventory=None):
    """Check a bundle against the inventory: complete, checksums right, versions equal to the pins."""
    from dtlab import bundle

    _harness_call(bundle.verify_command, path, inventory)


# --- top level ---------------------------------------------------------------

@task(help={"lint": "run ruff, lint-imports, yamllint and ansible-lint (default: yes)",
            "fast": "the inner loop: no lab, no cluster, no slow test, on every core (about 2 minutes)",
            "all": "the full tier: every lab and slow test (about an hour); run it before resolving a change "
                   "to roles/, dtlab/lab, dtlab/platforms or trainer/strategies",
            "pytest_args": "extra pytest arguments, e.g. '-k report -x'"})
def test(c, lint=True, fast=False, all_=False, pytest_args=""):
    """The default tier and the linters (what CI runs; README's table); --fast, --all for the other tiers."""
    from dtlab import commands

    if fast and all_:
        print("error: test: --fast and --all are two different tiers; give one", file=sys.stderr)
        sys.exit(2)
    tier = "fast" if fast else "all" if all_ else "default"
    if not commands.run_tests(c, lint=lint, tier=tier, pytest_args=pytest_args):
        sys.exit(1)


@task(help={"name": LAB_NAME_HELP, "faults": "then bench.faults: every platform with a worker killed"})
def demo(c, name=None, faults=False):
    """lab.up, ansible-playbook site.yml, trainer.deploy, bench.all --profile smoke, then the report."""
    from dtlab import commands

    _harness_call(commands.demo, name, faults)


lab = Collection("lab", lab_up, lab_down, lab_status, lab_ssh, lab_restart_node)
cluster = Collection("cluster", cluster_check, cluster_doctor, cluster_provision, cluster_idle, cluster_reset)
trainer = Collection("trainer", trainer_deploy)
bench = Collection("bench", bench_all, bench_run, bench_faults, bench_report, bench_compare, bench_export)
bundle = Collection("bundle", bundle_build, bundle_verify)

ns = Collection(lab, cluster, trainer, bench, bundle, test, demo)
