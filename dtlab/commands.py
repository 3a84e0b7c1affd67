"""The bodies of the `invoke` commands (tasks.py only declares them): read the inventory, call the
harness, print what a user needs. Bad input raises DtlabError, which tasks.py prints as one line."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from dtlab import cluster as cluster_module
from dtlab import doctor, paths
from dtlab.bench import Bench, BenchOptions, Display
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.outcome import CellOutcome
from dtlab.paths import results_dir_for
from dtlab.platforms import load_cluster
from dtlab.report import (
    STUDY_REPORT_DIR,
    EmptyStoreError,
    ReportFiles,
    compare,
    generate_report,
    parse_priorities,
    write_report,
)
from dtlab.report.build import build_study_report
from dtlab.report.mlperf_export import MlperfExport, export_mlperf
from dtlab.results import ResultStore, mlperf_log

# --- cluster and trainer -------------------------------------------------------------


def cluster_check(inventory: str | None) -> None:
    cluster_module.check_or_raise(load_cluster(inventory))


def cluster_doctor(inventory: str | None, as_json: bool = False) -> doctor.Diagnosis:
    """invoke cluster.doctor: the health gate's diagnosis, as a table or (as_json) one JSON document.
    Exit 0 healthy, 1 a check failed (DoctorFailed), 2 it could not run (DtlabError: its one line, and
    with --json a JSON document with status "error" too, so a script always gets JSON)."""
    try:
        diagnosis = doctor.diagnose(load_cluster(inventory))
    except DtlabError as error:
        if as_json:
            print(json.dumps({"format": doctor.GATE_FORMAT, "status": "error", "error": str(error)}))
        raise
    if as_json:
        print(json.dumps(diagnosis.as_json(), indent=2))
    else:
        doctor.render(diagnosis)
    if not diagnosis.healthy:
        raise doctor.DoctorFailed(f"cluster.doctor: {diagnosis.summary()} on {diagnosis.cluster.name}")
    return diagnosis


def cluster_reset(inventory: str | None) -> None:
    """Back to a clean, known state; the cells with recorded results keep their scratch."""
    target = load_cluster(inventory)
    recorded = {run.cell_key for run in ResultStore.for_cluster(target.name).runs(status="ok")}
    outcome = cluster_module.reset(target, recorded_cells=recorded)
    silent = ", ".join(outcome.unreachable)
    if len(outcome.unreachable) == len(target.nodes):
        raise cluster_module.ClusterUnhealthy(f"cluster.reset: no node answers ({silent}); nothing was reset")
    cluster_module.render(outcome.rows, target, command="cluster.reset")
    failing = cluster_module.failed(outcome.rows)
    problems = ([f"{silent} did not answer (not reset)"] if outcome.unreachable else []) + (
        [f"{len(failing)} check(s) fail"] if failing else [])
    if problems:
        raise cluster_module.ClusterUnhealthy(f"cluster.reset: done, but {'; '.join(problems)}")


def trainer_deploy(inventory: str | None) -> None:
    from dtlab.deploy import deploy

    deploy(load_cluster(inventory))


# --- bench -----------------------------------------------------------------------------


def bench_options(profile, only, force, retries, timeout, verbose, matrix, report=True,
                  skip_gate=False) -> BenchOptions:
    """The bench flags as given on the command line (strings), checked."""
    try:
        retries, timeout = int(retries), (int(timeout) if timeout not in (None, "") else None)
    except ValueError:
        raise DtlabError(f"--retries {retries} / --timeout {timeout}: must be whole numbers") from None
    return BenchOptions(profile=profile, only=only, force=force, retries=retries, timeout_s=timeout,
                        verbose=verbose, matrix_path=Path(matrix) if matrix else None, report=report,
                        skip_gate=skip_gate)


def matrix_summary(command: str, profile: str, outcomes: list[CellOutcome], drained: dict[str, str]
                   ) -> list[str]:
    """The lines that end a matrix: what ran, what was recorded before, what failed, and each node the
    health gate drained with the cells skipped for it."""
    done = sum(o.status == "ok" for o in outcomes)
    failed_cells = sum(o.status == "failed" for o in outcomes)
    recorded = sum(o.status == "skipped" and not o.skipped_because for o in outcomes)
    skipped = [o for o in outcomes if o.skipped_because]
    line = f"{command} {profile}: {done} ran ok, {recorded} already recorded, {failed_cells} failed"
    if skipped:
        line += f", {len(skipped)} skipped ({', '.join(drained)} drained)"
    lines = [line]
    for node, reason in drained.items():
        keys = [o.cell.key for o in skipped if o.skipped_because.startswith(f"{node} drained")]
        lines.append(f"drained: {node} ({reason}); skipped: {', '.join(keys) or 'no later cell needed it'}")
    return lines


def matrix_report(cluster: Cluster, profile: str | None, say=print) -> Path | None:
    """The report after a matrix run; an empty store is a note here, not an error."""
    try:
        files = generate_report(ResultStore.for_cluster(cluster.name), profile=profile)
    except EmptyStoreError as note:
        say(str(note))
        return None
    say(f"report: {files.markdown} (HTML {files.html})")
    return Path(files.markdown)


def bench_all(inventory: str | None, options: BenchOptions, needs_fault_plan: bool = False
              ) -> list[CellOutcome]:
    """invoke bench.all: validate inventory, matrix and flags, run every cell, then write the report.
    invoke bench.faults is the same over a profile with a fault plan (needs_fault_plan)."""
    cluster = load_cluster(inventory)
    bench = Bench(cluster, options)
    selected = bench.load_matrix()  # every bad flag or matrix fails here, before any node is touched
    if needs_fault_plan and not any(cell.fault for cell in selected.cells):
        raise DtlabError(f"bench.faults: profile {selected.profile} in {selected.source} has no fault plan; "
                         "add `fault: {kind: kill, after_epoch: 1}` to it or use --profile faults")
    try:
        outcomes = bench.run_matrix(selected)
    except KeyboardInterrupt:
        (bench.display.console.print if bench.display else print)(
            "interrupted: the running cell's units are stopped on every node; recorded results are intact"
        )
        raise
    command = "bench.faults" if needs_fault_plan else "bench.all"
    for line in matrix_summary(command, selected.profile, outcomes, bench.drained):
        print(line)
    if options.report:  # bench.faults: its fault section beside the tables of the newest undisturbed runs
        matrix_report(cluster, None if needs_fault_plan else selected.profile)
    return outcomes


def bench_run(inventory: str | None, cell_key: str, options: BenchOptions) -> CellOutcome:
    """invoke bench.run CELL: exactly one cell of the profile (recorded or not: it always runs)."""
    cluster = load_cluster(inventory)
    bench = Bench(cluster, options)
    selected = bench.load_matrix()
    matching = [c for c in selected.cells if c.key == cell_key]
    if not matching:
        raise DtlabError(
            f"bench.run {cell_key}: no such cell in profile {selected.profile}; cells: "
            f"{', '.join(c.key for c in selected.cells)}"
        )
    one = replace(selected, cells=tuple(matching))
    bench.check_cells(one)  # this machine's checks first, then the nodes': as bench.all does them
    bench.store.check(writable=True)
    if not options.skip_gate:  # an unreachable cluster is refused before an attempt is reserved
        bench.run_gate()
    bench.check_before_start(one)
    bench.display = Display(1, options.verbose)
    bench.display.pending = list(matching)
    with bench.display:
        outcome = bench.run_cell(matching[0], bench.timeout_for(selected))
        bench.display.finish_cell(outcome)
    return outcome


def bench_report(
    *,
    inventory: str | None = None,
    results_dir: str | os.PathLike[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    profile: str | None = None,
    study: bool = False,
    priorities: str | None = None,
) -> ReportFiles:
    """`invoke bench.report`: resolve the results folder, write the report, print where it went.

    An empty store raises EmptyStoreError (one line, exit 1: there is no report to read). Bad input
    raises DtlabError (exit 2). With `study`, the report is rendered from the study's published runs
    alone (default folder results/study-report). `priorities` (criteria in order, or a weights file) adds
    the recommendation (Table B.11); a bad one is refused before anything is read or written.
    """
    chosen = parse_priorities(priorities) if priorities is not None else None
    if study:
        if results_dir is not None or profile is not None or inventory is not None:
            raise DtlabError("bench.report: --study reads only the study's published runs; "
                             "leave out --inventory, --results-dir and --profile")
        files = write_report(build_study_report(chosen), Path(out) if out is not None else STUDY_REPORT_DIR)
    else:
        if results_dir is None:
            # Only the cluster's name is read, no node is contacted: the example's placeholders pass.
            results_dir = results_dir_for(load_cluster(inventory, allow_placeholders=True).name)
        files = generate_report(results_dir, out, profile=profile, priorities=chosen)
    for line in files.left_out:  # the report's header names them too; the console must not hide them
        print(f"bench.report: left out {line}", file=sys.stderr)
    print(f"report: {files.markdown}")
    print(f"        {files.html}")
    print(f"        {len(files.csv)} CSV tables in {files.csv[0].parent}, {len(files.figures)} figure files")
    if files.left_out:
        raise DtlabError(f"bench.report: {len(files.left_out)} stored run(s) could not be read and are left "
                         "out of the report (named above); the report was written without them")
    return files


def bench_export(cell: str, *, mlperf: str | None = None, inventory: str | None = None,
                 results_dir: str | os.PathLike[str] | None = None,
                 profile: str | None = None) -> MlperfExport:
    """`invoke bench.export CELL --mlperf DIR`: the cell's runs as MLPerf's summarizer and compliance checker
    read them (dtlab.report.mlperf_export); bad input is one line before anything is written."""
    if mlperf is None:
        raise DtlabError("bench.export: give --mlperf DIR, the folder to lay the cell's runs out in")
    if results_dir is None:
        results_dir = results_dir_for(load_cluster(inventory, allow_placeholders=True).name)
    done = export_mlperf(ResultStore(results_dir), cell, mlperf, profile=profile)
    target = "none set" if done.target_accuracy is None else f"{done.target_accuracy:g}"
    print(f"bench.export: {len(done.results)} run(s) of {cell} in {done.benchmark_dir} "
          f"(target accuracy {target}, {done.missed_target} missed)")
    print(f"  system {done.system_file}; rules with the target: {done.ruleset_file}")
    print(f"  check: python -m mlperf_logging.compliance_checker --usage {mlperf_log.USAGE} "
          f"--ruleset {mlperf_log.RULESET} --config {done.ruleset_file} {done.results[0]}")
    return done


def bench_compare(a: str, b: str, *, revisions: str | None = None, profile: str | None = None
                  ) -> compare.Comparison:
    """`invoke bench.compare A B`: each matching cell's figures, B against A, marked regression, improvement
    or within noise (dtlab/report/compare.py); the caller exits 1 on a regression. Bad input raises
    DtlabError (one line, exit 2) before anything is printed."""
    compared = compare.compare_runs(a, b, revisions=revisions, profile=profile)
    for line in compared.lines():
        print(line)
    return compared


# --- the demo ----------------------------------------------------------------------------


def demo(name: str | None, faults: bool = False) -> list[CellOutcome]:
    """lab.up, site.yml (shown as it runs), trainer.deploy, bench.all --profile smoke and its report;
    with `faults`, then bench.faults (the smoke cells are its undisturbed twins) and the report again."""
    import dtlab.lab
    from dtlab.deploy import deploy
    from dtlab.provision import converge

    # The platforms' controller builds (Horovod's compile) start first and overlap the lab's image and the
    # converge's first roles. The trainer role's wheelhouse fill starts once the image is built, so that its
    # downloads do not share the network with the image's (the image took 92 and 97 s beside them, 66 s
    # without: one run each, inside the image's earlier 58-94 s, so not shown). The roles' own steps wait
    # for them. Any lab's group_vars will do.
    lab_vars = load_cluster(paths.INVENTORY_DIR / "lab.yml")
    builds = _start_controller_builds(lab_vars)
    try:
        config = dtlab.lab.up(name)
        builds += _start_wheelhouse_fill(lab_vars)
        inventory = str(config.inventory_path)
        print(f"demo 1/4: lab {config.name} up ({inventory}); provisioning with ansible-playbook site.yml")
        converged = converge(inventory, progress=print)
    finally:
        _stop_builds(builds)
    if not converged.ok:
        raise DtlabError(f"demo: site.yml did not converge: {converged.summary()}")
    print(f"provisioned: {converged.summary()}")
    print("demo 2/4: trainer.deploy")
    deploy(load_cluster(inventory))
    print("demo 3/4: bench.all --profile smoke (then 4/4: the report)")
    outcomes = bench_all(inventory, BenchOptions(profile="smoke"))
    if faults:
        print("demo --faults: bench.faults (a worker killed after epoch 1, per platform), then the report")
        outcomes += bench_all(inventory, BenchOptions(profile="faults"), needs_fault_plan=True)
    return outcomes


def _start_wheelhouse_fill(cluster: Cluster) -> list:
    from dtlab.provision import start_wheelhouse_fill

    log = paths.STATE_DIR / "logs" / "trainer-wheelhouse-fill.log"
    fill = start_wheelhouse_fill(cluster, log)
    if fill:
        print(f"demo: the trainer role's wheelhouse fill started beside the converge (log: {log})")
    return [fill] if fill else []


def _start_controller_builds(cluster: Cluster) -> list:
    from dtlab import platforms

    builds = []
    for platform in platforms.ALL:
        log = paths.STATE_DIR / "logs" / f"{platform.name}-controller-build.log"
        build = platform.start_controller_build(cluster, log)
        if build:
            print(f"demo: {platform.name}'s controller build started beside the lab's start (log: {log})")
            builds.append(build)
    return builds


def _stop_builds(builds: list) -> None:
    """A build the converge did not wait for (it failed or was interrupted first) is ended, by its group."""
    from dtlab.waiting import stop_process_group

    for build in builds:
        stop_process_group(build)


# --- invoke test ---------------------------------------------------------------

# lint-imports: the layer contracts in pyproject.toml ([tool.importlinter]), no import cycles.
ANSIBLE_LINT = "ansible-lint --profile production --offline"
LINTERS = ("ruff check .", "lint-imports", "yamllint -s .", ANSIBLE_LINT)
# ansible-lint takes a minute of CPU (a syntax check per playbook and role), most of --fast's lint on 2
# cores, and the inner loop seldom touches Ansible. A pass is kept for the exact files it may read and its
# version; --fast skips it until one of them changes. The whole suite (CI's command) always runs it.
ANSIBLE_LINT_PASSED = paths.STATE_DIR / "ansible-lint.passed"
ANSIBLE_LINT_CONFIG = paths.REPO_ROOT / ".ansible-lint"
# The three selections. The tier a lab or slow test belongs to is its markers' choice (pyproject.toml):
# `core` puts it in the default tier, the one path that proves a capability end to end; without it, only
# `--all` runs it. tests/test_tiers.py checks that the default tier keeps what README's table promises.
# The README's test command and CI's: every quick test, one lab converged once, and the core tests.
DEFAULT_TIER_MARKERS = "not (lab or slow) or core"
# The full tier runs its quick tests (neither lab nor slow) on every core first (pytest-xdist: 3m38s in one
# process on 2 cores, 2026-12-04), then its lab and slow tests in one pytest process, in order: they share
# one lab and its converge, which is prepared while the slow tests that need no lab run. The default tier
# stays one process: there the quick tests are what runs while the lab is prepared (on a fresh machine the
# image and Horovod's compile too), and its few slow tests would leave that preparation bare.
QUICK_TESTS = "not (lab or slow)"
TIERS = {
    # The inner loop: no lab, no Spark cluster, nothing marked slow.
    "fast": (f"-m '{QUICK_TESTS}' -n auto",),
    "default": (f"-m '{DEFAULT_TIER_MARKERS}'",),
    # Everything: every fault on every platform, re-converges, check mode, a second lab, the clusters.
    "all": (f"-m '{QUICK_TESTS}' -n auto", "-m 'lab or slow'"),
}
# The lab's and slow tests never run beside the quick ones: tried on 2 cores (2026-11-26), the lab's tests
# as a second process beside the others were slower, not faster: both are CPU-bound. pytest-xdist's --dist
# loadgroup, the way to keep the lab's tests together in one xdist run, does not group under pytest 9.2 (it
# writes the group into the node id, which pytest no longer reads). (benchmarks/README.md, Tests.)
# pytest's exit status when a pass selects nothing (e.g. `--pytest-args` naming quick tests only).
NO_TESTS_SELECTED = 5
# The default and full tiers' temporary files (the lab's results, inventories) in a folder of their own:
# pytest keeps the 3 newest session folders under /tmp and deletes older ones as each session starts, so a
# quick `--fast` run beside a long one used to delete the long one's files mid-run.
FULL_SUITE_BASETEMP = paths.STATE_DIR / "pytest-full"


def ansible_lint_inputs_digest() -> str | None:
    """A digest of every file ansible-lint may read (git's tracked and untracked, not ignored, files outside
    .ansible-lint's exclude_paths; not Markdown, a kind it recognises but has no rule for) and of its own
    and ansible-core's versions; None outside a git checkout."""
    import fnmatch
    import hashlib
    import importlib.metadata
    import subprocess

    import yaml

    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=paths.REPO_ROOT, capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    excluded = yaml.safe_load(ANSIBLE_LINT_CONFIG.read_text()).get("exclude_paths", [])
    digest = hashlib.sha256()
    for package in ("ansible-lint", "ansible-core"):
        digest.update(f"{package}=={importlib.metadata.version(package)}\0".encode())
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        if name.endswith(".md") or any(name.startswith(pattern) or fnmatch.fnmatch(name, pattern)
                                       for pattern in excluded):
            continue
        path = paths.REPO_ROOT / name
        if path.is_file():  # a tracked file deleted in the work tree is not read
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def run_tests(c, *, lint: bool, tier: str, pytest_args: str) -> bool:
    """pytest on one of TIERS, pass by pass, with the linters beside it; True when everything passed. `c` is
    the invoke Context."""
    fast = tier == "fast"
    linters = list(LINTERS)
    lint_inputs = ansible_lint_inputs_digest() if lint else None
    kept_pass = ANSIBLE_LINT_PASSED.read_text() if ANSIBLE_LINT_PASSED.is_file() else None
    if fast and lint_inputs and kept_pass == lint_inputs:
        linters.remove(ANSIBLE_LINT)
        print("ansible-lint: not run, it passed on these same files before (--fast keeps a pass; "
              "the whole suite always runs it)")
    linting = c.run(" && ".join(linters), asynchronous=True, hide=True, warn=True) if lint else None
    passed, selected = True, False
    if not fast:
        FULL_SUITE_BASETEMP.mkdir(parents=True, exist_ok=True)  # pytest makes a --basetemp, not its parents
    exit_first = {"-x", "--exitfirst"} & set(pytest_args.split())
    for number, selection in enumerate(TIERS[tier]):  # each pass runs, so a failure shows the whole picture
        if not fast:
            selection += f" --basetemp={FULL_SUITE_BASETEMP / f'pass-{number + 1}'}"
        ran = c.run(f"pytest {selection} {pytest_args}".strip(), echo=True, pty=False, warn=True)
        selected = selected or ran.exited != NO_TESTS_SELECTED
        passed = passed and (ran.ok or ran.exited == NO_TESTS_SELECTED)
        if not passed and exit_first:
            break
    passed = passed and selected  # a selection that runs no test at all is a mistake, as pytest says
    if linting is not None:
        linted = linting.join()
        print(f"lint ({' && '.join(linters)}): {'passed' if linted.ok else 'FAILED'}")
        if not linted.ok:
            print(linted.stdout + linted.stderr, end="")
        elif ANSIBLE_LINT in linters and lint_inputs:
            ANSIBLE_LINT_PASSED.parent.mkdir(parents=True, exist_ok=True)
            ANSIBLE_LINT_PASSED.write_text(lint_inputs)
        passed = passed and linted.ok
    return passed
