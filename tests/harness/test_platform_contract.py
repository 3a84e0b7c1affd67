"""The Platform contract, over every registered platform: a platform that misses a piece fails here, not
in a user's run (dtlab/platforms/base.py says what each piece is)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest
import yaml
from harness_helpers import CPU_CLUSTER_3, CPU_SITE_VARS, write_inventory
from result_factory import made_up_result

from dtlab import launch as launching
from dtlab import matrix, paths, pins, platforms, remote
from dtlab.cell import Cell
from dtlab.checks import CheckRow
from dtlab.errors import DtlabError
from dtlab.inventory import read_cluster
from dtlab.platforms import load_cluster
from dtlab.platforms.base import UPSTREAM_KEYS, Platform, ResetSteps, register, registered
from dtlab.report import generate_report
from dtlab.results import Provenance, ResultStore
from dtlab.roles import all_defaults, role_layers
from trainer import config as trainer_config
from trainer import result as trainer_result

ABSTRACT = ("build", "check_rows", "reset", "recovery")
GROUP_VARS = yaml.safe_load((paths.REPO_ROOT / "inventory" / "group_vars" / "all.yml").read_text())
SETTINGS = {**all_defaults(), **GROUP_VARS}  # what every host reads: the roles' defaults under group_vars
each_platform = pytest.mark.parametrize("platform", platforms.ALL, ids=lambda p: p.name)


@pytest.fixture
def cluster(tmp_path):
    """Three loopback nodes: node 0 master, nodes 1-2 workers; the lab's services under their names."""
    return load_cluster(write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": CPU_SITE_VARS}))


def test_a_platform_is_named_by_its_package_folder_and_by_no_list():
    """Adding a platform edits no list of names (issue #56): the registry, the matrix schema and the cell
    units take the names from dtlab/platforms/'s folders; the trainer keeps none, only their shape."""
    assert platforms.NAMES == paths.platform_names() == tuple(sorted(platforms.NAMES))
    frameworks = matrix.SCHEMA["$defs"]["run"]["properties"]["frameworks"]
    assert frameworks["anyOf"][0]["enum"] == list(platforms.NAMES)
    assert tuple(f"dtlab-{name}-g*" for name in platforms.NAMES) == remote.CELL_UNIT_PATTERNS
    framework = trainer_result.load_schema()["properties"]["framework"]
    assert "enum" not in framework and framework["pattern"] == trainer_config.FRAMEWORK_PATTERN
    assert all(re.fullmatch(trainer_config.FRAMEWORK_PATTERN.strip("^$"), name) for name in platforms.NAMES)
    assert not hasattr(trainer_config, "FRAMEWORKS")


@each_platform
def test_every_part_of_the_interface_is_implemented(platform: Platform):
    missing = [part for part in ABSTRACT if getattr(type(platform), part) is getattr(Platform, part)]
    assert not missing, f"{platform.name} does not implement {missing}"
    for attribute in ("label", "colour", "description", "reset_title"):
        assert isinstance(getattr(platform, attribute), str) and getattr(platform, attribute).strip()
    assert re.fullmatch(r"#[0-9a-f]{6}", platform.colour)
    upstream = platform.upstream()  # its upstream_health, every key stated
    assert set(UPSTREAM_KEYS) <= set(upstream) and isinstance(upstream["maintained"], bool), upstream
    assert platform.launcher_files and all((paths.REPO_ROOT / f).is_file() for f in platform.launcher_files)
    roles = paths.REPO_ROOT / "roles"
    assert all((roles / role / "tasks").is_dir() for role in platform.roles), platform.roles
    assert platform.check_names


def test_labels_and_colours_tell_the_platforms_apart():
    count = len(platforms.ALL)
    assert len({p.label for p in platforms.ALL}) == len({p.colour for p in platforms.ALL}) == count


@each_platform
def test_its_variables_and_services_are_set_in_group_vars_or_its_own_roles_defaults(platform: Platform):
    for prefix in platform.variable_prefixes:
        assert any(name.startswith(prefix) for name in SETTINGS), f"no variable name starts {prefix}"
    for variable in platform.service_variables:
        in_its_roles = [role for role in platform.roles if variable in role_layers(role, "ubuntu-noble")[0]]
        assert (variable in GROUP_VARS) != bool(in_its_roles), (
            f"{variable}: set neither in group_vars/all.yml nor in one of its roles' defaults, or in both")
    for first, last in platform.port_ranges:
        assert int(SETTINGS[first]) <= int(SETTINGS[last])


@each_platform
def test_it_has_check_rows_with_its_own_names(platform: Platform, cluster):
    # Every node answered cluster.check's probe, with none of the platform's services installed.
    states = {node.name: {} for node in cluster.nodes}
    rows = platform.check_rows(cluster, states)
    assert rows and all(isinstance(row, CheckRow) for row in rows)
    assert {row.check for row in rows} <= set(platform.check_names), rows
    gpu_rows = platform.gpu_rows(cluster, list(cluster.workers))
    assert {row.check for row in gpu_rows} <= set(platform.check_names)
    assert all(row.ok or not row.required for row in gpu_rows), "a cpu inventory has no GPU to fail on"


@each_platform
def test_it_has_a_reset_step(platform: Platform, cluster):
    ran: list[tuple[tuple[str, ...], str]] = []
    said: list[str] = []
    nobody_answers = ResetSteps(cluster, said.append, lambda nodes, command, what, timeout: ran.append(
        (tuple(n.name for n in nodes), what)), lambda nodes: [])
    rows = platform.reset(nobody_answers)
    assert ran or said, "the step does something or says why not"
    assert all(isinstance(row, CheckRow) for row in rows)
    assert all(nodes == () or what for nodes, what in ran)


@each_platform
def test_the_matrix_accepts_it_with_and_without_a_fault_plan(platform: Platform, tmp_path, cluster):
    document = {"profiles": {
        "plain": {"runs": [{"frameworks": [platform.name], "gpus": [1, 2], "epochs": [2], "seeds": [0]}]},
        "faulted": {"fault": {"kind": "kill", "after_epoch": 1},
                    "runs": [{"frameworks": [platform.name], "gpus": [2], "epochs": [2], "seeds": [0]}]},
    }, "default_profile": "plain"}
    path = tmp_path / "matrix.yml"
    path.write_text(yaml.safe_dump(document))
    plain = matrix.load("plain", path, max_gpus=2, device="cpu")
    assert [cell.framework for cell in plain.cells] == [platform.name, platform.name]
    twin, faulted = matrix.load("faulted", path, max_gpus=2, device="cpu").cells
    assert faulted.fault and not twin.fault and faulted.framework == platform.name
    assert platform.recovery(cluster).strip()
    assert platform.build(cluster, faulted, 1, 600).cell == faulted


@each_platform
def test_a_search_cell_runs_the_plan_its_node_gets_or_is_refused_in_one_line(platform: Platform, cluster):
    """Scenario C (#54): each platform that runs searches launches a search launcher reading the plan that
    prepare writes, and its cell's result is search.json; any other refuses the cell in one line."""
    tune = matrix.load("tune")
    for stopping in ("asha", "none"):
        cell = next(cell for cell in tune.cells if cell.search == stopping)
        cell = dataclasses.replace(cell, framework=platform.name)
        refusal = platform.search_refusal(cluster, stopping)
        if refusal is not None:
            assert refusal.startswith("search: ") and "\n" not in refusal
            continue
        launch = platform.build(cluster, cell, 1, 600)
        argv = [part for _, spec in launch.jobs for part in spec.argv]
        assert launch.paths.search_plan_path in argv and "--search" in argv, argv
        assert any(module in argv for module in ("trainer.launchers.sweep", "trainer.launchers.ray_tune"))
        assert launch.paths.result_path.endswith("/out/search.json")
        written = launching.prepare_command(launch, cluster.user, fresh=True)
        assert launch.paths.search_plan_path in written and '"early_stopping": "' + stopping in written
    assert platforms.get(platforms.BASELINE).search_refusal(cluster, "none") is None  # Table B.16's baseline


@each_platform
def test_a_serve_cell_serves_its_trained_cells_checkpoint_with_that_cells_config_or_is_refused(
        platform: Platform, cluster):
    """Scenario C (#54): a platform that serves starts servers on the cluster's addresses with the trained
    cell's own trainer config (its checkpoint's config hash), reading that cell's checkpoints; the
    trainer's expected answers come from a unit of the cell's own; any other refuses in one line."""
    serve = matrix.load("serve")
    trained_cell = serve.cells[0]
    cell = next(cell for cell in serve.cells if cell.trained == trained_cell)
    cell = dataclasses.replace(cell, framework=platform.name)
    refusal = platform.serve_refusal(cluster)
    if refusal is not None:
        assert refusal.startswith("serve: ") and "\n" not in refusal
        # It says where a checkpoint can be served instead: every platform that names its server.
        assert all(f" on {other.name}" in refusal for other in platforms.ALL if other.server), refusal
        return
    launch, trained = platform.build(cluster, cell, 1, 600), platforms.get(trained_cell.framework).build(
        cluster, trained_cell, 1, 600)
    served, own = (trainer_config.TrainConfig(**launch.trainer_config),
                   trainer_config.TrainConfig(**trained.trainer_config))
    assert trainer_config.config_hash(served) == trainer_config.config_hash(own)
    assert launch.trainer_config["checkpoint_dir"] == trained.paths.checkpoint_dir
    assert launch.trainer_config["output_dir"] == launch.paths.output_dir != trained.paths.output_dir
    addresses = {node.address for node in cluster.nodes}
    assert launch.serving.urls and all(url.split("/")[2].split(":")[0] in addresses and
                                       url.endswith(launching.PREDICT_PATH) for url in launch.serving.urls)
    node, expected = launch.serving.expected
    assert "trainer.launchers.expected" in expected.argv and node in cluster.workers
    assert expected.unit.startswith(remote.unit_name(cell.key, ""))  # bench's stop_cell stops it too
    assert launch.serving.load.concurrency == (1, 8, 32)


@each_platform
def test_a_cells_strategy_reaches_the_trainer_config_it_launches_with(platform: Platform, cluster):
    fsdp = Cell(platform.name, gpus=2, epochs=2, seed=0, profile="p", strategy="fsdp")
    assert platform.build(cluster, fsdp, 1, 600).trainer_config["strategy"] == "fsdp"
    ddp = Cell(platform.name, gpus=2, epochs=2, seed=0, profile="p")
    assert "strategy" not in platform.build(cluster, ddp, 1, 600).trainer_config  # the trainer's default


@each_platform
def test_the_report_renders_a_run_of_it(platform: Platform, tmp_path):
    store = ResultStore(tmp_path / "results")
    for seed in (1, 2, 3):
        cell = Cell(platform.name, gpus=1, epochs=2, seed=seed, profile="smoke")
        result = made_up_result(platform.name, 1, 2, seed, time_total_s=20.0 + seed, final_accuracy=0.6,
                                device="cpu")
        store.record_ok(
            cell,
            result,
            Provenance(
                config_hash="0123456789abcdef",
                git_rev=None,
                inventory="lab",
                node_versions={},
                harness_time_s=24.0,
            ),
        )
    files = generate_report(store, tmp_path / "report", profile="smoke")
    markdown = Path(files.markdown).read_text()
    assert platform.label in markdown


def _launcher_syncs_gradients(platform: Platform) -> bool:
    """Whether the platform's trainer launcher sets TrainHooks.syncs_gradients (its optimizer averages
    every gradient itself), read from the launcher's source: Horovod's imports horovod, absent here."""
    for launcher in platform.launcher_files:
        for node in ast.walk(ast.parse((paths.REPO_ROOT / launcher).read_text())):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for name, value in zip(names, values, strict=False):
                    if isinstance(name, ast.Name) and name.id == "syncs_gradients":
                        return isinstance(value, ast.Constant) and value.value is True
    return False


def test_a_platforms_strategy_refusals_are_the_trainers_own_fact_for_every_strategy():
    """Platform.strategy_refusal (torch-free, asked before any cell starts) against what the trainer's
    core raises later: a launcher that syncs gradients runs only the strategies whose
    runs_under_gradient_syncing_launcher is true. The two cannot drift apart."""
    import torch

    from trainer import strategies

    cpu = torch.device("cpu")
    runs_under_syncing = {name: strategies.load(name, cpu, 0, 1).runs_under_gradient_syncing_launcher
                          for name in strategies.NAMES}
    assert runs_under_syncing[strategies.DEFAULT], "the default strategy runs everywhere"
    syncing = [p.name for p in platforms.ALL if _launcher_syncs_gradients(p)]
    assert syncing == ["horovod"], "the one launcher whose optimizer averages the gradients, found"
    for platform in platforms.ALL:
        for name in strategies.NAMES:
            refusal = platform.strategy_refusal(name)
            runs = runs_under_syncing[name] or platform.name not in syncing
            assert (refusal is None) == runs, (platform.name, name, refusal)
            if refusal is not None:  # one line: what, where, why, and what to do
                assert "\n" not in refusal and name in refusal and platform.label in refusal
                assert "averages every gradient itself" in refusal
                assert f"use strategy {strategies.DEFAULT}" in refusal


def test_a_refused_strategy_stops_the_matrix_before_the_gate_and_writes_nothing(tmp_path, loopback_inventory):
    """bench.all and bench.run: the platform's refusal, one line, before the health gate (whose nodes here
    refuse every connection) and before the store is touched: the results folder stays byte for byte."""
    from dtlab.bench import Bench, BenchOptions

    store = ResultStore(tmp_path / "results")
    cell = Cell("horovod", gpus=1, epochs=2, seed=0, profile="p")
    store.record_ok(cell, made_up_result("horovod", 1, 2, 0, time_total_s=20.0, final_accuracy=0.6,
                                         device="cpu"),
                    Provenance(config_hash="0123456789abcdef", git_rev=None, inventory="lab"))

    def snapshot() -> dict[str, bytes]:
        return {str(f.relative_to(store.root)): f.read_bytes() for f in sorted(store.root.rglob("*"))
                if f.is_file()}

    before = snapshot()
    path = tmp_path / "matrix.yml"
    path.write_text(yaml.safe_dump({"profiles": {"p": {"runs": [
        {"frameworks": ["ddp", "horovod"], "strategies": ["ddp", "zero1"], "gpus": [2], "epochs": [2],
         "seeds": [0]}]}}}))
    bench = Bench(load_cluster(loopback_inventory), BenchOptions(profile="p", matrix_path=path), store=store)
    selected = bench.load_matrix()
    assert [c.key for c in selected] == ["ddp-g2-e2-s0", "horovod-g2-e2-s0", "ddp-g2-e2-s0-zero1",
                                         "horovod-g2-e2-s0-zero1"]
    expected = (f"{path}: profiles.p: cell horovod-g2-e2-s0-zero1: strategy zero1 cannot run under Horovod, "
                "whose optimizer averages every gradient itself; use strategy ddp on horovod, or zero1 on "
                "another platform")
    for start in (bench.run_matrix, bench.check_before_start):
        with pytest.raises(DtlabError) as refused:
            start(selected)
        assert str(refused.value) == expected
    assert snapshot() == before
    assert not (store.root / paths.GATE_DIRNAME).exists()
    # The cells it can run pass the same check: only the refused one stops the matrix.
    bench.check_cells(dataclasses.replace(selected, cells=selected.cells[:3]))


PLATFORMS_DIR = paths.REPO_ROOT / "dtlab" / "platforms"


def test_each_platform_is_a_package_of_its_own_that_registers_itself():
    """dtlab/platforms/<name>/ holds the platform (its class, and PLATFORM, which it registered on import);
    the registry lists no platform: it imports the packages beside it, in the order of their names."""
    packages = sorted(p.name for p in PLATFORMS_DIR.iterdir() if (p / "__init__.py").is_file())
    assert packages == list(platforms.NAMES)
    for platform in platforms.ALL:
        package = importlib.import_module(f"dtlab.platforms.{platform.name}")
        assert package.PLATFORM is platform and type(platform).__module__ == package.__name__
    registry = ast.parse((PLATFORMS_DIR / "__init__.py").read_text())
    named = {node.value for node in ast.walk(registry) if isinstance(node, ast.Constant)}
    named &= set(platforms.NAMES)
    assert named == set(), "the registry names no platform (its docstring aside)"
    assert platforms.BASELINE == trainer_config.DEFAULT_FRAMEWORK in platforms.NAMES


@pytest.mark.parametrize("platform", platforms.ALL, ids=lambda p: p.name)
def test_its_python_client_is_what_setup_and_the_nodes_read_and_is_installed_here(platform: Platform):
    """python_client and node_imports are read without importing the package (dtlab.pins, for setup.sh and
    the trainer role): a value the reader cannot see as a literal would leave its client off every venv."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    declared = pins.platform_declarations()[platform.name]
    assert declared == {"python_client": platform.python_client, "node_imports": platform.node_imports}
    for requirement in platform.python_client:
        distribution = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
        try:
            version(distribution)
        except PackageNotFoundError:
            pytest.fail(f"{platform.name}'s client {requirement} is missing: setup.sh skipped it")
    for module in platform.node_imports:
        assert find_spec(module) is not None, f"{platform.name}'s node import {module} is not importable"


def test_a_platform_registers_from_its_own_package_only():
    class Elsewhere(Platform):
        name = "ddp"

    with pytest.raises(ImportError, match="registers from its own package, dtlab.platforms.ddp"):
        register(Elsewhere())
    assert platforms.get("ddp") is not None and registered()["ddp"] is platforms.get("ddp")


def test_the_inventory_checks_of_every_platform_run_as_the_inventory_is_read(tmp_path):
    """dtlab.inventory reads and checks what every inventory has; each platform adds its own checks
    (Platform.check_inventory_host, check_inventory, port_ranges) through platforms.load_cluster."""
    assert platforms.INVENTORY_CHECKS.port_ranges == tuple(r for p in platforms.ALL for r in p.port_ranges)
    site = CPU_SITE_VARS + "spark_session: server\n"
    path = write_inventory(tmp_path, CPU_CLUSTER_3, group_vars={"all": site})
    assert read_cluster(path).nodes, "without the platforms' checks, the inventory alone passes"
    with pytest.raises(DtlabError, match="spark_session must be application or connect, got 'server'"):
        platforms.load_cluster(path)


def _harness_modules() -> list[Path]:
    """dtlab's modules outside dtlab/platforms/."""
    return [path for path in sorted((paths.REPO_ROOT / "dtlab").rglob("*.py"))
            if PLATFORMS_DIR not in path.parents]


def test_outside_the_platform_packages_the_harness_names_no_platform_and_none_of_its_variables():
    """A platform's knowledge lives in its package: no other module of dtlab spells a platform's name, nor
    one of its group_vars (its variable_prefixes, service_variables and port_ranges), as a string, an
    attribute or a definition. (trainer/launchers/ is the platforms' side of the trainer.)"""
    prefixes = tuple(prefix for platform in platforms.ALL for prefix in platform.variable_prefixes)
    owned = {variable for platform in platforms.ALL
             for variable in (*platform.service_variables, *(v for r in platform.port_ranges for v in r))}
    named = []
    for path in _harness_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                word = node.value
            elif isinstance(node, ast.Attribute):
                word = node.attr
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                word = node.name
            else:
                continue
            platform_name = word in platforms.NAMES and isinstance(node, ast.Constant)
            if platform_name or word.startswith(prefixes) or word in owned:
                named.append(f"{path.relative_to(paths.REPO_ROOT)}:{node.lineno}: {word!r}")
    assert not named, named


def test_a_platforms_data_paths_are_its_launchers_own():
    """Platform.data_paths (asked before any cell starts) against the launcher: a platform offers its own
    ETL exactly where its launcher files hand the core the platform's rows (trainer/platform_data.py)."""
    for platform in platforms.ALL:
        launcher_text = "".join((paths.REPO_ROOT / f).read_text() for f in platform.launcher_files)
        etl_files = list((paths.REPO_ROOT / "trainer" / "launchers").glob(f"_{platform.name}*.py"))
        uses_platform_rows = "platform_data" in launcher_text + "".join(p.read_text() for p in etl_files)
        assert ("platform" in platform.data_paths) == uses_platform_rows, platform.name
        assert platform.data_path_refusal("loader") is None
        refusal = platform.data_path_refusal("platform")
        if refusal is not None:
            assert "\n" not in refusal and platform.label in refusal and refusal.endswith("use loader")


def test_a_data_path_the_platform_or_the_cluster_lacks_stops_the_matrix_in_one_line(tmp_path,
                                                                                    loopback_inventory):
    """A platform ETL cell: refused where the launcher has none, and where the inventory has no shared disk
    for the ETL's reviews and rows; before the gate, nothing written."""
    from dtlab.bench import Bench, BenchOptions

    path = tmp_path / "matrix.yml"
    path.write_text(yaml.safe_dump({"profiles": {"p": {"runs": [
        {"frameworks": ["spark", "ddp"], "data_paths": ["loader", "platform"], "gpus": [2], "epochs": [2],
         "seeds": [0]}]}}}))
    store = ResultStore(tmp_path / "results")
    bench = Bench(load_cluster(loopback_inventory), BenchOptions(profile="p", matrix_path=path), store=store)
    selected = bench.load_matrix()
    assert [c.key for c in selected] == ["spark-g2-e2-s0", "ddp-g2-e2-s0", "spark-g2-e2-s0-etl",
                                         "ddp-g2-e2-s0-etl"]
    with pytest.raises(DtlabError) as refused:
        bench.check_before_start(selected)
    assert str(refused.value) == (
        f"{path}: profiles.p: cell spark-g2-e2-s0-etl: data_path platform: the platform's ETL reads and "
        "writes on a disk every node mounts; set dtlab_shared_checkpoint_dir in the inventory, or use loader")
    shared_disk = f"{CPU_SITE_VARS}\ndtlab_shared_checkpoint_dir: /srv/shared\n"
    shared = write_inventory(tmp_path / "shared-inv", CPU_CLUSTER_3.replace("127.0.20.", "127.0.66."),
                             group_vars={"all": shared_disk})
    bench = Bench(load_cluster(shared), BenchOptions(profile="p", matrix_path=path), store=store)
    with pytest.raises(DtlabError) as refused:
        bench.run_matrix(selected)
    assert str(refused.value) == (
        f"{path}: profiles.p: cell ddp-g2-e2-s0-etl: data_path platform: PyTorch DDP's launcher has no ETL "
        "of its own (trainer/platform_data.py names those that have); use loader")
    assert not store.root.exists()
