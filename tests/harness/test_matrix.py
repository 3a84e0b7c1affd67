"""experiments/matrix.yml: the profiles the issue asks for, and one clear line for each bad matrix."""

import dataclasses

import pytest
import yaml

from dtlab import matrix, platforms
from dtlab.cell import Fault, config_hash, trainer_options
from dtlab.errors import DtlabError
from trainer.options import parse_args

RUN = "runs: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0}]"
SEARCH = "search: {space: {learning_rate: {loguniform: [1.0e-4, 3.0e-3]}}, trials: 2, budget_epochs: 2}\n"
SERVE = "serve: {ways: [ddp, ray], concurrency: [1, 8], requests: 16}\n"
TRAINED = "runs: [{frameworks: ddp, gpus: 1, epochs: 2, seeds: 0}]"


def test_study_profile_is_the_reference_studys_matrix_plus_ray_and_slurm_beyond_it():
    study = matrix.load("study")
    keys = {cell.key for cell in study}
    assert len(study) == 5 * 2 * 5 + 5 * 2 * 1
    for framework in ("ddp", "spark", "determined", "ray", "slurm"):
        for gpus in (1, 2):
            assert {f"{framework}-g{gpus}-e20-s{seed}" for seed in range(1, 6)} <= keys
            assert f"{framework}-g{gpus}-e100-s1" in keys
    options = study.cells[0].trainer_config
    assert options["model"] == "prajjwal1/bert-tiny" and options["dataset"] == "stanfordnlp/imdb"
    assert (
        options["learning_rate"],
        options["weight_decay"],
        options["warmup_steps"],
        options["batch_size"],
    ) == (5e-5, 0.01, 500, 32)


def test_smoke_profile_runs_every_framework_on_one_and_two_workers_with_generated_data():
    smoke = matrix.load("smoke", max_gpus=2)
    # Every platform of the registry, in the profile's order, at 1 worker, then at 2.
    listed = ("ddp", "spark", "determined", "ray", "slurm", "horovod")
    assert set(listed) == set(platforms.NAMES)
    assert [c.key for c in smoke] == [f"{name}-g{gpus}-e2-s0" for gpus in (1, 2) for name in listed]
    assert platforms.NAMES == ("ddp", "determined", "horovod", "ray", "slurm", "spark")
    options = smoke.cells[0].trainer_config
    assert options["dataset"] == "generated" and options["model"].startswith("generated:")
    assert all(1 <= c.epochs <= 2 for c in smoke)


def test_default_profile_is_smoke():
    assert matrix.load().profile == "smoke"


@pytest.mark.parametrize("profile", matrix.profiles())
def test_every_cell_is_a_config_file_the_trainer_accepts(profile, tmp_path):
    # The trainer's own parsing and validation, of the options a node gets for each cell.
    for cell in matrix.load(profile):
        options = {**trainer_options(cell), "output_dir": str(tmp_path / "out")}
        if cell.data_path != "loader":  # the harness adds the shared disk's folder (launch.trainer_config)
            options["platform_data_dir"] = str(tmp_path / "shared")
        config_file = tmp_path / f"{cell.key}.yml"
        config_file.write_text(yaml.safe_dump(options))
        config = parse_args(["--config", str(config_file)])
        assert {key: getattr(config, key) for key in options} == options


def test_a_bad_value_in_any_profile_stops_the_file(tmp_path):
    # The whole file is one document: a broken profile is found whichever one runs.
    path = tmp_path / "matrix.yml"
    path.write_text(f"profiles:\n  p: {{{RUN}}}\n  other: {{trainer: {{batch_size: 0}}, {RUN}}}\n")
    with pytest.raises(DtlabError) as failure:
        matrix.load("p", path)
    assert str(failure.value) == f"{path}: profiles.other.trainer.batch_size: must be an integer >= 1, got 0"


def test_trainer_options_are_parsed_as_the_trainer_parses_them(matrix_file):
    # YAML reads 1e-3 (no dot) as a string; the trainer takes it, so the matrix does too, and hands it on as
    # written (the cell's hash is of what the file says).
    [cell] = matrix.load("p", matrix_file(f"trainer: {{learning_rate: 1e-3}}\n{RUN}")).cells
    assert cell.trainer_config == {"learning_rate": "1e-3"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "runs: [{frameworks: [ddp, mpi], gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].frameworks[1]: must be one of ddp, determined, horovod, ray, slurm, spark; got 'mpi'",
        ),
        (
            "runs: [{frameworks: ddp, gpus: 1, epochs: 0, seeds: 0}]",
            "p.runs[0].epochs: must be an integer >= 1, got 0",
        ),
        (
            "runs: [{frameworks: ddp, gpus: 1, epochs: -3, seeds: 0}]",
            "p.runs[0].epochs: must be an integer >= 1, got -3",
        ),
        (
            "runs: [{frameworks: ddp, gpus: 0, epochs: 1, seeds: 0}]",
            "p.runs[0].gpus: must be an integer >= 1, got 0",
        ),
        (
            "runs: [{frameworks: ddp, gpus: [1, 0], epochs: 1, seeds: 0}]",
            "p.runs[0].gpus[1]: must be an integer >= 1, got 0",
        ),
        (
            "runs: [{frameworks: mpi, gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].frameworks: must be one of ddp, determined, horovod, ray, slurm, spark; got 'mpi'",
        ),
        (
            "runs: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: x}]",
            "p.runs[0].seeds: expected int or list, got 'x'",
        ),
        (
            "runs: [{frameworks: ddp, gpus: 1, epochs: [], seeds: 0}]",
            "p.runs[0].epochs: must be a non-empty list, got []",
        ),
        (
            "runs: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0}, "
            "{frameworks: [spark, ddp], gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[1]: duplicate cell ddp-g1-e1-s0 (already in",
        ),
        ("runs: [{frameworks: ddp, gpus: [1, 1], epochs: 1, seeds: 0}]", "duplicate cell ddp-g1-e1-s0"),
        (
            "runs: [{frameworks: ddp, gpus: 3, epochs: 1, seeds: 0}]",
            "p.runs[0].gpus: 3 GPUs but the inventory offers 2",
        ),
        ("runs: [{frameworks: ddp, gpus: 1, epochs: 1}]", "p.runs[0]: missing 'seeds'"),
        (
            "runs: [{frameworks: ddp, gpu: 1, gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].gpu: unknown key; did you mean gpus?",
        ),
        (
            "runs: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0, hosts: 2}]",
            "p.runs[0].hosts: unknown key; allowed: frameworks, strategies, data_paths, models, gpus, "
            "epochs, early_stopping, seeds",
        ),
        (
            "timeout: 60\nruns: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0}]",
            "p.timeout: unknown key; did you mean timeout_s?",
        ),
        (
            "trainer: [lr]\nruns: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0}]",
            "p.trainer: expected mapping, got ['lr']",
        ),
        (
            "trainer: {learning_rat: 0.1}\nruns: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0}]",
            "p.trainer.learning_rat: unknown trainer option; did you mean learning_rate?",
        ),
        (
            "trainer: {epochs: 3}\nruns: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0}]",
            "p.trainer.epochs: set per cell by the harness",
        ),
        (
            "timeout_s: 0\nruns: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0}]",
            "p.timeout_s: must be a positive number of seconds (per cell), got 0",
        ),
        ("runs: []", "p.runs: must be a non-empty list"),
        ("description: smoke", "p: missing 'runs'"),
        ("runs: [{frameworks: ddp, gpus: 1, seeds: 0}]", "p.runs[0]: 'epochs' is a required property"),
        (
            "runs: [{frameworks: ddp, gpus: 1, epochs: 1, seeds: 0, early_stopping: asha}]",
            "p.runs[0].early_stopping: only a profile with a search: section runs searches",
        ),
        # Scenario C's search (#54): bad input in one line, before any trial starts.
        (SEARCH + "runs: [{frameworks: ddp, gpus: 1, epochs: 2, seeds: 0}]",
         "p.runs[0].epochs: a search's trials train search.budget_epochs; remove epochs"),
        (SEARCH + "runs: [{frameworks: ddp, strategies: [zero1], gpus: 1, seeds: 0}]",
         "p.runs[0].strategies: a search's trials train the profile's trainer: options alone"),
        (SEARCH + "fault: {kind: kill, after_epoch: 1}\nruns: [{frameworks: ddp, gpus: 1, seeds: 0}]",
         "p.fault: a search profile takes no fault plan"),
        (SEARCH + "runs: [{frameworks: ddp, gpus: 1, seeds: 0, early_stopping: [asha, asha]}]",
         "p.runs[0].early_stopping: each early stopping once"),
        (SEARCH.replace("1.0e-4", "-1.0e-4").replace("loguniform", "uniform")
         + "runs: [{frameworks: ddp, gpus: 1, seeds: 0}]",
         "p: search: space: learning_rate -0.0001 would be refused by the trainer: learning_rate"),
        (SEARCH.replace("budget_epochs: 2", "budget_epochs: 0")
         + "runs: [{frameworks: ddp, gpus: 1, seeds: 0}]",
         "p: search: budget_epochs must be a whole number of epochs, at least 1, got 0"),
        # ... and its serving: a load the cluster would not bound, or a way that is no platform.
        (SERVE.replace("[ddp, ray]", "[ddp, mpi]") + TRAINED,
         "p.serve.ways: 'mpi' is not a platform; choose from ddp, determined"),
        (SERVE.replace("[ddp, ray]", "[ddp, ddp]") + TRAINED, "p.serve.ways: must list the platforms"),
        (SERVE.replace("[1, 8]", "[1, 0]") + TRAINED,
         "p.serve: concurrency: must be a list of integers 1-256"),
        (SERVE.replace("16", "4") + TRAINED,
         "p.serve: requests: must be an integer from the highest concurrency (8) to 10000, got 4"),
        (SERVE.replace("}", ", port: 80}") + TRAINED, "p.serve.port: must be a TCP port 1024-65535, got 80"),
        (SERVE.replace("}", ", host: 8.8.8.8}") + TRAINED, "p.serve: unknown key host; the keys are ways"),
        (SERVE + SEARCH + "runs: [{frameworks: ddp, gpus: 1, seeds: 0}]", "p: a profile searches or serves"),
        (SERVE + "fault: {kind: kill, after_epoch: 1}\n" + TRAINED,
         "p.fault: a serve profile takes no fault"),
        (SERVE + "runs: [{frameworks: [ddp, ray], gpus: 1, epochs: 2, seeds: 0}]",
         "p.runs: a serve profile trains the one checkpoint every way serves; list one framework"),
    ],
)
def test_a_bad_matrix_fails_with_one_line_naming_the_key(matrix_file, body, message):
    """Every problem is one line naming the file and the key, raised by load, before anything starts."""
    path = matrix_file(body)
    with pytest.raises(DtlabError) as failure:
        matrix.load("p", path, max_gpus=2)
    text = str(failure.value)
    assert message in text
    assert "\n" not in text and text.startswith(str(path))


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        # The trainer's own rules, checked on the controller: one class of bad values per case.
        ("batch_size: 0", "p.trainer.batch_size: must be an integer >= 1, got 0"),
        ("batch_size: -32", "p.trainer.batch_size: must be an integer >= 1, got -32"),
        ("batch_size: 2.5", "p.trainer.batch_size: expected int, got 2.5"),
        ("batch_size: true", "p.trainer.batch_size: expected int, got True"),
        ("max_length: 0", "p.trainer.max_length: must be between 8 and 512"),
        ("max_length: 4096", "p.trainer.max_length: must be between 8 and 512"),
        ("learning_rate: -1.0e-4", "p.trainer.learning_rate: must be > 0, got -0.0001"),
        ("learning_rate: fast", "p.trainer.learning_rate: expected float, got 'fast'"),
        ("weight_decay: -0.1", "p.trainer.weight_decay: must be >= 0"),
        ("warmup_steps: -5", "p.trainer.warmup_steps: must be an integer >= 0, got -5"),
        ("dropout: 1.5", "p.trainer.dropout: must be in [0, 1) or null"),
        ("optimizer: adam", "p.trainer.optimizer: must be one of adamw, sgd; got 'adam'"),
        ("mixed_precision: fp8", "p.trainer.mixed_precision: must be one of auto, no, bf16, fp16"),
        ("compile: max-autotune", "p.trainer.compile: must be one of"),
        ("model: 'generated:bert-huge'", "p.trainer.model: must be one of generated:bert-tiny"),
        ("dataset: ''", "p.trainer.dataset: is empty; give a hub id or a local path"),
        ("dataset: generated, generated_train_size: 1", "p.trainer.generated_train_size: must be between 2"),
        # Cross-checks against what the inventory trains on (the lab: cpu).
        ("mixed_precision: fp16", "p.trainer.mixed_precision: fp16 is CUDA-only; use auto or no on cpu"),
        ("compile: reduce-overhead", "p.trainer.compile: reduce-overhead captures CUDA graphs"),
    ],
)
def test_bad_trainer_options_stop_the_matrix_on_the_controller(matrix_file, tmp_path, trainer, message):
    path = matrix_file(f"trainer: {{{trainer}}}\n{RUN}")
    with pytest.raises(DtlabError) as failure:
        matrix.load("p", path, max_gpus=2, device="cpu")
    text = str(failure.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text
    assert not (tmp_path / "out").exists(), "checking values creates nothing"


def test_fp16_is_fine_where_the_inventory_trains_on_gpus(matrix_file):
    path = matrix_file(f"trainer: {{mixed_precision: fp16, dataset: /data/imdb-on-the-nodes}}\n{RUN}")
    [cell] = matrix.load("p", path, max_gpus=2, device="cuda").cells
    # A local path is the nodes' business: bench checks it there before the first cell.
    assert cell.trainer_config == {"dataset": "/data/imdb-on-the-nodes", "mixed_precision": "fp16"}


def test_unknown_profile_and_broken_yaml_fail_with_one_line(tmp_path, matrix_file):
    with pytest.raises(DtlabError, match=r"no profile 'nope'; choose one of study, smoke"):
        matrix.load("nope")
    broken = tmp_path / "broken.yml"
    broken.write_text("profiles: [unclosed\n")
    with pytest.raises(DtlabError, match="not valid YAML"):
        matrix.load("p", broken)
    with pytest.raises(DtlabError, match="cannot read"):
        matrix.load("p", tmp_path / "missing.yml")


def test_only_filters_by_framework_gpus_and_globs():
    smoke = matrix.load("smoke")
    assert [c.key for c in smoke.select("ddp")] == ["ddp-g1-e2-s0", "ddp-g2-e2-s0"]
    assert [c.key for c in smoke.select("g2")] == ["ddp-g2-e2-s0", "spark-g2-e2-s0", "determined-g2-e2-s0",
                                                 "ray-g2-e2-s0", "slurm-g2-e2-s0", "horovod-g2-e2-s0"]
    assert [c.key for c in smoke.select("spark-g1,determined-g2")] == [
        "spark-g1-e2-s0",
        "determined-g2-e2-s0",
    ]
    assert [c.key for c in smoke.select("d*-g1")] == ["ddp-g1-e2-s0", "determined-g1-e2-s0"]
    with pytest.raises(DtlabError, match="--only 'mpi': matches no cell of profile smoke"):
        smoke.select("mpi")


def test_config_hash_is_stable_and_changes_with_what_changes_the_run():
    first, again = matrix.load("study").cells[0], matrix.load("study").cells[0]
    assert config_hash(first) == config_hash(again)
    hashes = {config_hash(c) for c in matrix.load("study")}
    assert len(hashes) == len(matrix.load("study"))  # seed, epochs, GPUs and framework all count
    smoke_ddp = matrix.load("smoke").cells[0]
    assert config_hash(smoke_ddp) != config_hash(matrix.load("study").cells[0])


def test_config_hash_changes_with_the_generated_tokenizer(monkeypatch):
    # Results recorded with another generated tokenizer were trained on other tokens: bench.all reruns them.
    import trainer.config

    smoke_ddp, study_ddp = matrix.load("smoke").cells[0], matrix.load("study").cells[0]
    before = config_hash(smoke_ddp), config_hash(study_ddp)
    next_version = trainer.config.GENERATED_TOKENIZER_VERSION + 1
    monkeypatch.setattr(trainer.config, "GENERATED_TOKENIZER_VERSION", next_version)
    assert config_hash(smoke_ddp) != before[0]
    assert config_hash(study_ddp) == before[1]  # IMDB and the hub's bert-tiny: named by their ids


@pytest.mark.parametrize(("profile", "sizes", "seeds"), [
    ("pipeline_25k", (25000, 2500), [1, 2, 3]),
    ("pipeline_250k", (250000, 25000), [1]),
])
def test_the_pipeline_size_profiles_are_the_pipeline_profiles_cells_at_more_data(profile, sizes, seeds):
    """Issue #53's whole run at IMDB's size and ten times it: the same cells (platforms, data paths), more
    data; 250k runs one seed of them (a cell takes about 20 minutes on the lab)."""
    small, large = matrix.load("pipeline"), matrix.load(profile)
    twins = {cell.key: cell for cell in small.cells}
    assert [cell.key for cell in large.cells] == [cell.key for cell in small.cells if cell.seed in seeds]
    assert len(large.cells) == 4 * len(seeds)
    assert {cell.data_path for cell in large.cells} == {"loader", "platform"}
    for cell in large.cells:
        twin = twins[cell.key]
        options, twin_options = trainer_options(cell), trainer_options(twin)
        assert (options["generated_train_size"], options["generated_test_size"]) == sizes
        assert options["generated_median_words"] == 230 and options["token_cache"] is False
        differs = {key for key in options.keys() | twin_options.keys()
                   if options.get(key) != twin_options.get(key)}
        assert differs == {"generated_train_size", "generated_test_size", "generated_median_words"}, differs
        assert config_hash(cell) != config_hash(twin)


def test_the_faults_profile_runs_each_platform_undisturbed_then_with_its_fault():
    faults = matrix.load("faults")
    keys = [cell.key for cell in faults]
    assert keys[:2] == ["ddp-g2-e2-s0", "ddp-g2-e2-s0-kill-after1"]
    assert {cell.framework for cell in faults} == set(platforms.NAMES)
    for undisturbed, faulted in zip(faults.cells[::2], faults.cells[1::2], strict=True):
        assert faulted.undisturbed == undisturbed and not undisturbed.fault
        assert faulted.fault_plan.kind == "kill" and faulted.fault_plan.after_epoch == 1
        assert config_hash(faulted) != config_hash(undisturbed)
    # The twins are the smoke profile's 2-worker cells: a lab that ran the demo has them recorded.
    smoke = {cell.key: config_hash(cell) for cell in matrix.load("smoke")}
    assert all(smoke[cell.key] == config_hash(cell) for cell in faults.cells[::2])


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("{kind: kill, after_epoch: 2}", "p.fault.after_epoch: 2, but cell ddp-g1-e2-s0 has 2 epochs"),
        ("{kind: crash, after_epoch: 1}", "p.fault.kind: must be one of kill, netdrop"),
        ("{kind: kill, after_epoch: 0}", "p.fault.after_epoch: must be an epoch >= 1, got 0"),
        ("{kind: netdrop, after_epoch: 1}", "p.fault.seconds: a netdrop needs seconds"),
        ("{kind: kill, after_epoch: 1, seconds: 5}", "p.fault.seconds: only a netdrop lasts"),
        ("{kind: kill, after_epoch: 1, nodes: node2}", "p.fault.nodes: unknown key; did you mean node?"),
        ("{kind: kill, after_epoch: 1, recovery: shrink}",
         "p.fault.recovery: must be one of restart, elastic"),
        ("{kind: netdrop, after_epoch: 1, seconds: 5, recovery: elastic}",
         "p.fault.recovery: elastic goes on without a lost node, which a kill makes"),
    ],
)
def test_a_bad_fault_plan_fails_with_one_line_naming_the_key(matrix_file, fault, message):
    path = matrix_file(f"fault: {fault}\nruns: [{{frameworks: ddp, gpus: 1, epochs: 2, seeds: 0}}]")
    with pytest.raises(DtlabError) as failure:
        matrix.load("p", path, max_gpus=2)
    text = str(failure.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_a_fault_plan_with_a_node_and_a_netdrop_names_both_in_the_cell_key(matrix_file):
    path = matrix_file("fault: {kind: netdrop, after_epoch: 1, seconds: 20, node: node2}\n"
                       "runs: [{frameworks: ray, gpus: 2, epochs: 3, seeds: 4}]")
    [_, faulted] = matrix.load("p", path, max_gpus=2)
    assert faulted.key == "ray-g2-e3-s4-netdrop-after1-20s-node2"
    plan = faulted.fault_plan
    assert (plan.kind, plan.after_epoch, plan.seconds, plan.node) == ("netdrop", 1, 20, "node2")


def test_an_elastic_plan_is_in_its_cells_key_and_reads_back_from_it(matrix_file):
    path = matrix_file("fault: {kind: kill, after_epoch: 1, recovery: elastic}\n"
                       "runs: [{frameworks: ddp, gpus: 2, epochs: 2, seeds: 0}]")
    [undisturbed, faulted] = matrix.load("p", path, max_gpus=2)
    assert faulted.key == "ddp-g2-e2-s0-elastic-kill-after1" and faulted.undisturbed == undisturbed
    plan = faulted.fault_plan
    assert plan.elastic and (plan.kind, plan.after_epoch, plan.recovery) == ("kill", 1, "elastic")
    assert not Fault.parse("kill-after1").elastic and Fault.parse("kill-after1-node2").node == "node2"


# --- the data paths axis ---------------------------------------------------------------------------------


def test_data_paths_are_an_axis_whose_platform_cells_end_in_etl_and_whose_loader_cells_keep_their_hash(
        matrix_file):
    [plain] = matrix.load("p", matrix_file(RUN)).cells
    path = matrix_file("runs: [{frameworks: [spark, ray], data_paths: [loader, platform], gpus: 2, "
                       "epochs: 1, seeds: 0}]")
    cells = matrix.load("p", path, max_gpus=2).cells
    assert [c.key for c in cells] == ["spark-g2-e1-s0", "ray-g2-e1-s0", "spark-g2-e1-s0-etl",
                                      "ray-g2-e1-s0-etl"]
    assert [c.data_path for c in cells] == ["loader", "loader", "platform", "platform"]
    assert "data_path" not in trainer_options(cells[0])
    assert trainer_options(cells[2])["data_path"] == "platform"
    assert len({config_hash(c) for c in cells}) == 4
    [loader] = matrix.load("p", matrix_file(RUN.replace("seeds: 0", "seeds: 0, data_paths: loader"))).cells
    assert loader == plain and config_hash(loader) == config_hash(plain)
    assert cells[2].undisturbed == cells[2]


@pytest.mark.parametrize(("body", "message"), [
    ("runs: [{frameworks: spark, data_paths: [loader, spark], gpus: 1, epochs: 1, seeds: 0}]",
     "p.runs[0].data_paths[1]: must be one of loader, platform; got 'spark'"),
    ("runs: [{frameworks: spark, data_paths: [platform, platform], gpus: 1, epochs: 1, seeds: 0}]",
     "p.runs[0].data_paths: each data path once, got ['platform', 'platform']"),
    (f"trainer: {{data_path: platform}}\n{RUN}",
     "p.trainer.data_path: set per run: list it under the run's data_paths:"),
    (f"trainer: {{platform_data_dir: /srv}}\n{RUN}",
     "p.trainer.platform_data_dir: set per cell by the harness"),
])
def test_a_bad_data_paths_axis_fails_with_one_line_naming_the_file_and_key(matrix_file, body, message):
    path = matrix_file(body)
    with pytest.raises(DtlabError) as failure:
        matrix.load("p", path, max_gpus=2, device="cpu")
    assert str(failure.value).startswith(f"{path}: profiles.{message}") and "\n" not in str(failure.value)


# --- the strategies axis ---------------------------------------------------------------------------------


def test_a_run_without_strategies_is_ddp_and_its_keys_and_hashes_are_as_before(matrix_file):
    [cell] = matrix.load("p", matrix_file(RUN)).cells
    assert cell.strategy == "ddp" and cell.key == "ddp-g1-e1-s0"
    assert "strategy" not in trainer_options(cell)  # hashed only when set, as the trainer hashes it
    [explicit] = matrix.load("p", matrix_file(RUN.replace("seeds: 0", "seeds: 0, strategies: [ddp]"))).cells
    assert explicit == cell and config_hash(explicit) == config_hash(cell)


def test_strategies_are_an_axis_of_every_run_with_the_strategy_in_key_hash_and_trainer_config(matrix_file):
    path = matrix_file("runs: [{frameworks: [ddp, ray], strategies: [ddp, zero1, fsdp_no_reshard], gpus: 2, "
                       "epochs: 1, seeds: 0}]")
    cells = matrix.load("p", path, max_gpus=2).cells
    assert [c.key for c in cells] == ["ddp-g2-e1-s0", "ray-g2-e1-s0", "ddp-g2-e1-s0-zero1",
                                      "ray-g2-e1-s0-zero1", "ddp-g2-e1-s0-fsdp_no_reshard",
                                      "ray-g2-e1-s0-fsdp_no_reshard"]
    assert len({config_hash(c) for c in cells}) == len(cells)
    assert trainer_options(cells[2])["strategy"] == "zero1"
    zero1 = matrix.load("p", path).select("zero1")
    assert [c.key for c in zero1] == ["ddp-g2-e1-s0-zero1", "ray-g2-e1-s0-zero1"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "runs: [{frameworks: ddp, strategies: [ddp, zero2], gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].strategies[1]: must be one of ddp, zero1, fsdp, fsdp_no_reshard, tensor, pipeline; "
            "got 'zero2'",
        ),
        (
            "runs: [{frameworks: ddp, strategies: megatron, gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].strategies: must be one of ddp, zero1, fsdp, fsdp_no_reshard, tensor, pipeline; "
            "got 'megatron'",
        ),
        (
            "runs: [{frameworks: ddp, strategies: [fsdp, fsdp], gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].strategies: each strategy once, got ['fsdp', 'fsdp']",
        ),
        (
            "runs: [{frameworks: ddp, strategies: [], gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].strategies: must be a non-empty list, got []",
        ),
        (
            "runs: [{frameworks: ddp, strategy: zero1, gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].strategy: unknown key; did you mean strategies?",
        ),
        (
            # One place for the fact: the run's axis, never the profile's trainer section.
            f"trainer: {{strategy: zero1}}\n{RUN}",
            "p.trainer.strategy: set per run: list it under the run's strategies:",
        ),
        (
            "trainer: {microbatches: 4}\n"
            "runs: [{frameworks: ddp, strategies: [pipeline, zero1], gpus: 2, epochs: 1, seeds: 0}]",
            "p.trainer.microbatches: an option of strategy pipeline, not of zero1; leave it unset "
            "(under runs[0]'s strategy zero1)",
        ),
        (
            "trainer: {compile: default}\n"
            "runs: [{frameworks: ddp, gpus: 2, epochs: 1, seeds: 0}, "
            "{frameworks: ray, strategies: [zero1, pipeline], gpus: 2, epochs: 1, seeds: 0}]",
            "p.trainer.compile: strategy pipeline runs its stages eagerly (torch.distributed.pipelining "
            "calls each stage per microbatch); use compile no (under runs[1]'s strategy pipeline)",
        ),
        (
            # A value every strategy refuses is named as any bad value is, with no strategy.
            "trainer: {batch_size: 0}\n"
            "runs: [{frameworks: ddp, strategies: [ddp, tensor], gpus: 2, epochs: 1, seeds: 0}]",
            "p.trainer.batch_size: must be an integer >= 1, got 0",
        ),
        (
            "runs: [{frameworks: ddp, strategies: fsdp, gpus: 1, epochs: 1, seeds: 0}, "
            "{frameworks: ddp, strategies: [ddp, fsdp], gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[1]: duplicate cell ddp-g1-e1-s0-fsdp (already in",
        ),
    ],
)
def test_a_bad_strategies_axis_fails_with_one_line_naming_the_file_and_key(matrix_file, body, message):
    path = matrix_file(body)
    with pytest.raises(DtlabError) as failure:
        matrix.load("p", path, max_gpus=2, device="cpu")
    text = str(failure.value)
    assert text.startswith(f"{path}: profiles.") and message in text and "\n" not in text
    if "batch_size" in message:
        assert text == f"{path}: profiles.{message}"


def test_a_strategy_only_option_is_fine_where_every_run_uses_that_strategy(matrix_file):
    path = matrix_file("trainer: {microbatches: 4, pipeline_schedule: gpipe}\n"
                       "runs: [{frameworks: [ddp, slurm], strategies: pipeline, gpus: 2, epochs: 1, "
                       "seeds: 0}]")
    cells = matrix.load("p", path, max_gpus=2, device="cpu").cells
    assert [c.key for c in cells] == ["ddp-g2-e1-s0-pipeline", "slurm-g2-e1-s0-pipeline"]
    assert trainer_options(cells[0])["microbatches"] == 4


def test_the_strategies_profile_runs_every_strategy_on_two_workers_and_horovod_ddp_only():
    from trainer import strategies

    profile = matrix.load("strategies", max_gpus=2, device="cpu")
    every = list(profile)
    assert {(c.gpus, c.epochs, c.seed) for c in every} == {(2, 2, 0)}
    # One size up, under torchrun alone: every strategy again on bert-mini (Figure B.4's second point).
    sized = [c for c in every if c.model]
    assert {(c.framework, c.model) for c in sized} == {("ddp", "generated:bert-mini")}
    assert [c.strategy for c in sized] == list(strategies.NAMES)
    assert [c.key for c in sized][:2] == ["ddp-g2-e2-s0-bert-mini", "ddp-g2-e2-s0-zero1-bert-mini"]
    cells = [c for c in every if not c.model]
    by_strategy = {name: {c.framework for c in cells if c.strategy == name} for name in strategies.NAMES}
    others = set(platforms.NAMES) - {"horovod"}
    expected = {name: others | ({"horovod"} if name == "ddp" else set()) for name in strategies.NAMES}
    assert by_strategy == expected
    # Its ddp cells are the smoke profile's 2-worker cells (same keys, same hashes): recorded once, skipped.
    smoke = {c.key: config_hash(c) for c in matrix.load("smoke") if c.gpus == 2}
    assert {c.key: config_hash(c) for c in cells if c.strategy == "ddp"} == smoke
    # No cell a platform refuses: the profile runs whole.
    assert [c.key for c in every if platforms.get(c.framework).strategy_refusal(c.strategy)] == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            # bert-tiny (the default model, prajjwal1/bert-tiny: 2 heads, 2 layers) over 3 workers.
            "runs: [{frameworks: ddp, strategies: [ddp, tensor], gpus: [2, 3], epochs: 1, seeds: 0}]",
            "p.runs[0]: cell ddp-g3-e1-s0-tensor: strategy: tensor splits the model's 2 attention heads over "
            "the 3 workers, which does not divide them; use a world size that divides 2, or another strategy",
        ),
        (
            "trainer: {model: 'generated:bert-mini'}\n"
            "runs: [{frameworks: slurm, strategies: pipeline, gpus: [4, 5], epochs: 1, seeds: 0}]",
            "p.runs[0]: cell slurm-g5-e1-s0-pipeline: strategy: pipeline puts at least one of the model's 4 "
            "encoder layers on each of the 5 workers; use at most 4 workers, or another strategy",
        ),
        (
            "trainer: {microbatches: 3, batch_size: 8}\n"
            "runs: [{frameworks: ray, strategies: pipeline, gpus: 2, epochs: 1, seeds: 0}]",
            "p.runs[0]: cell ray-g2-e1-s0-pipeline: microbatches: 3 does not divide the global batch of 16 "
            "(batch_size x 2 workers); use a divisor of it",
        ),
    ],
)
def test_a_split_the_model_cannot_take_is_refused_before_the_matrix_starts(matrix_file, body, message):
    """The trainer's own refusal (trainer.strategies.split_refusal), met here for a model whose shape is
    known without loading it, instead of after the cell has started."""
    path = matrix_file(body)
    with pytest.raises(DtlabError) as failure:
        matrix.load("p", path, device="cpu")
    assert str(failure.value) == f"{path}: profiles.{message}"


def test_a_model_of_unknown_shape_is_left_to_the_trainer(matrix_file):
    path = matrix_file("trainer: {model: some-lab/bert-wide}\n"
                       "runs: [{frameworks: ddp, strategies: tensor, gpus: 3, epochs: 1, seeds: 0}]")
    assert [c.key for c in matrix.load("p", path, device="cpu").cells] == ["ddp-g3-e1-s0-tensor"]


# --- the models axis -----------------------------------------------------------------------------------


def test_models_are_an_axis_whose_profile_model_cells_keep_their_keys_and_hashes(matrix_file):
    """A run's models: beside the profile's trainer: model. The profile's own model's cells are the cells
    without the axis (same key, same hash: recorded once); another model's key ends in its label, its
    hash and trainer options name it, and each strategy's split is checked against its shape."""
    trainer = "trainer: {model: 'generated:bert-tiny'}\n"
    plain = matrix.load("p", matrix_file(trainer + "runs: [{frameworks: ddp, strategies: [ddp, tensor], "
                                         "gpus: 2, epochs: 1, seeds: 0}]"), device="cpu").cells
    path = matrix_file(trainer + "runs: [{frameworks: [ddp, ray], strategies: [ddp, tensor], models: "
                       "['generated:bert-tiny', 'generated:bert-mini'], gpus: 2, epochs: 1, seeds: 0}]")
    cells = matrix.load("p", path, device="cpu").cells
    assert [c.key for c in cells] == [
        "ddp-g2-e1-s0", "ray-g2-e1-s0", "ddp-g2-e1-s0-tensor", "ray-g2-e1-s0-tensor",
        "ddp-g2-e1-s0-bert-mini", "ray-g2-e1-s0-bert-mini", "ddp-g2-e1-s0-tensor-bert-mini",
        "ray-g2-e1-s0-tensor-bert-mini"]
    tiny = {c.key: config_hash(c) for c in cells if not c.model}
    assert {c.key: config_hash(c) for c in plain} == {k: v for k, v in tiny.items() if k.startswith("ddp")}
    assert len({config_hash(c) for c in cells}) == len(cells)
    mini = cells[-1]
    assert mini.model == "generated:bert-mini" and trainer_options(mini)["model"] == "generated:bert-mini"
    assert trainer_options(cells[0])["model"] == "generated:bert-tiny"
    assert [c.key for c in matrix.load("p", path).select("ddp-bert-mini")] == [
        "ddp-g2-e1-s0-bert-mini", "ddp-g2-e1-s0-tensor-bert-mini"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "runs: [{frameworks: ddp, models: ['generated:bert-mini', 'generated:bert-mini'], gpus: 1, "
            "epochs: 1, seeds: 0}]",
            "p.runs[0].models: each model once, got ['generated:bert-mini', 'generated:bert-mini']",
        ),
        (
            "runs: [{frameworks: ddp, models: [], gpus: 1, epochs: 1, seeds: 0}]",
            "p.runs[0].models: must be a non-empty list, got []",
        ),
        (
            # Two models that one label would name: their cells' keys would collide.
            "runs: [{frameworks: ddp, models: ['generated:bert-mini', 'prajjwal1/bert-mini'], gpus: 1, "
            "epochs: 1, seeds: 0}]",
            "p.runs[0].models: prajjwal1/bert-mini and generated:bert-mini would both be 'bert-mini' in cell "
            "keys; keep one of them in this profile",
        ),
        (
            "runs: [{frameworks: ddp, models: 'generated:bert-huge', gpus: 1, epochs: 1, seeds: 0}]",
            "p.trainer.model: must be one of generated:bert-tiny, generated:bert-mini, generated:bert-small, "
            "generated:bert-medium; got 'generated:bert-huge' (under runs[0]'s strategy ddp, model "
            "generated:bert-huge)",
        ),
        (
            # bert-tiny's 2 heads split over 2 workers; bert-mini's 4 layers do not go over 5 pipeline stages.
            "trainer: {model: 'generated:bert-tiny'}\n"
            "runs: [{frameworks: slurm, strategies: pipeline, models: ['generated:bert-tiny', "
            "'generated:bert-mini'], gpus: [2, 5], epochs: 1, seeds: 0}]",
            "p.runs[0]: cell slurm-g5-e1-s0-pipeline: strategy: pipeline puts at least one of the model's 2 "
            "encoder layers on each of the 5 workers",
        ),
    ],
)
def test_a_bad_models_axis_fails_with_one_line_naming_the_file_and_key(matrix_file, body, message):
    """Each refusal before anything starts; a model's own refusal names the run and the model."""
    path = matrix_file(body)
    with pytest.raises(DtlabError) as failure:
        matrix.load("p", path, device="cpu")
    text = str(failure.value)
    assert text.startswith(f"{path}: profiles.") and message in text and "\n" not in text


def test_a_serve_profile_trains_each_seed_then_serves_its_checkpoint_every_way():
    """The serve profile (#54): each seed's trained cell, then one serve cell per way serving that cell's
    checkpoint with its options; the serve cells' plan (load, port) is in their hash, not their key."""
    serve = matrix.load("serve")
    assert [cell.key for cell in serve.cells[:3]] == ["ddp-g2-e2-s1", "ddp-g2-e2-s1-serve",
                                                      "ray-g2-e2-s1-serve"]
    trained, plain, ray = serve.cells[:3]
    assert trained.trained is None and plain.trained == ray.trained == trained
    assert ray.task_plan["load"] == {"concurrency": [1, 8, 32], "requests": 256, "timeout_s": 30.0}
    other_port = dataclasses.replace(ray, task_plan={**ray.task_plan, "port": 9000})
    assert config_hash(ray) != config_hash(other_port)
    assert config_hash(trained) == config_hash(dataclasses.replace(trained, profile="smoke"))  # a plain run


def test_a_search_profile_runs_one_drawn_plan_in_every_way_seed_by_seed():
    """The tune profile (#54): search cells of the budget's epochs, each carrying the same drawn trials with
    its way's early stopping, the ways interleaved seed by seed; the plan is in the hash, not in the key."""
    tune = matrix.load("tune")
    assert [cell.key for cell in tune.cells[:4]] == [
        "ddp-g2-e2-s1-search-none", "ddp-g2-e2-s1-search-asha", "ray-g2-e2-s1-search-asha",
        "determined-g2-e2-s1-search-asha"]
    assert [cell.seed for cell in tune.cells] == sorted(cell.seed for cell in tune.cells)
    assert {cell.epochs for cell in tune.cells} == {2}
    trials = {tuple(map(str, cell.task_plan["trials"])) for cell in tune.cells}
    assert len(trials) == 1 and len(next(iter(trials))) == 4
    assert {cell.task_plan["early_stopping"] for cell in tune.cells} == {"none", "asha"}
    first = tune.cells[1]
    other_plan = {**first.task_plan, "budget_epochs": 3}
    assert config_hash(first) != config_hash(dataclasses.replace(first, task_plan=other_plan))
    assert config_hash(first) != config_hash(dataclasses.replace(first, task=""))
    assert first.undisturbed == first and first.search == "asha"
