"""The Ray launcher for real: a Ray cluster on loopback (a head with no CPUs, as the lab's master, and two
1-CPU worker raylets, token auth on), where Ray Train's TorchTrainer runs 2 CPU workers (gloo) through the
launcher. Ray's epochs must be torchrun's, a killed worker must be restarted by Ray and resume from the
checkpoint Ray registered, and a run Ray gives up on must end non-zero with one line."""

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from ray.train.v2._internal.constants import CHECKPOINT_MANAGER_SNAPSHOT_FILENAME

from tests.raycluster import RayCluster
from tests.trainer.conftest import TINY, free_loopback_port, run, torchrun_command, trainer_env, write_config
from trainer import data
from trainer.config import TrainConfig
from trainer.distributed import scheduler_gives_gpus
from trainer.launchers.ray import LABEL, PROG
from trainer.result import validate_result

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "trainer" / "launchers"
EPOCHS = 3
RUN_TIMEOUT_S = 420  # cluster start-up plus three epochs, twice over after a kill, on 2 busy cores
COMPARED = ("train_loss", "val_loss", "val_accuracy")  # per epoch, with tolerance 0


@pytest.fixture(scope="module")
def torchrun_reference(tmp_path_factory, token_cache) -> tuple[dict, Path]:
    """The same config and seed under torchrun, 2 processes: (its result, its checkpoint_dir)."""
    root = tmp_path_factory.mktemp("torchrun")
    cfg = TrainConfig(**{**TINY, "epochs": EPOCHS, "output_dir": str(root / "out"),
                         "cache_dir": str(token_cache), "checkpoint_dir": str(root / "ckpt")}).validate()
    run(torchrun_command(2, "--config", str(write_config(cfg, root / "run.yml"))))
    return json.loads((root / "out" / "result.json").read_text()), root / "ckpt"


def ray_command(cluster: RayCluster, cfg: TrainConfig, directory: Path, *flags: str) -> list[str]:
    """The launcher on `cfg` (written to directory/run.yml), as the harness starts it."""
    return [sys.executable, "-m", "trainer.launchers.ray", "--address", cluster.address,
            "--config", str(write_config(cfg, directory / "run.yml")), *flags]


def ray_env(cluster: RayCluster) -> dict:
    """The driver's environment, as the harness's unit gives it: the trainer's, Ray's token, PYTHONPATH
    (the raylets lack it: the launcher forwards it to the workers)."""
    return {**trainer_env(), **cluster.env, "PYTHONPATH": str(REPO)}


def registered_with_ray(checkpoint_dir: Path) -> list[str]:
    """The checkpoints Ray's controller registered, from its snapshot in the run directory."""
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):  # not yet, or half written
        snapshot = json.loads((checkpoint_dir / CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).read_text())
        return [entry["checkpoint_dir_name"] for entry in snapshot["checkpoint_results"]]
    return []


def assert_same_epochs(result: dict, reference: dict, same_config: bool = True) -> None:
    """The same per-epoch numbers; same_config: of the same config_hash (data_path platform has its own)."""
    if same_config:
        assert result["config_hash"] == reference["config_hash"]
    for key in COMPARED:
        assert [m[key] for m in result["epoch_metrics"]] == [m[key] for m in reference["epoch_metrics"]], key


def two_workers(cluster: RayCluster, cfg: TrainConfig, directory: Path
                ) -> tuple[subprocess.CompletedProcess, dict]:
    """The launcher with 2 workers, its exit checked: (its process, the result it wrote, schema-checked)."""
    command = ray_command(cluster, cfg, directory, "--num-workers", "2")
    launched = subprocess.run(command, env=ray_env(cluster), capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    result = json.loads((directory / "out" / "result.json").read_text())
    validate_result(result)
    return launched, result


@pytest.mark.slow
def test_two_workers_train_as_under_torchrun(loopback_ray, torchrun_reference, make_config, tmp_path):
    """device auto: the driver asks Ray's cluster for GPUs; this one offers none, so CPU (gloo) everywhere."""
    reference, _ = torchrun_reference
    cfg = make_config(epochs=EPOCHS, checkpoint_dir=str(tmp_path / "ckpt"), device="auto")
    started = time.time()
    launched, result = two_workers(loopback_ray, cfg, tmp_path)
    assert (result["framework"], result["framework_label"]) == ("ray", LABEL)
    assert (result["world_size"], result["device"], result["backend"]) == (2, "cpu", "gloo")
    assert result["resumed_from_epoch"] is None
    assert_same_epochs(result, reference)
    assert f"result: {tmp_path / 'out' / 'result.json'}" in launched.stdout  # the driver's copy
    assert registered_with_ray(tmp_path / "ckpt") == [f"epoch-{epoch:04d}" for epoch in range(1, EPOCHS + 1)]
    timeline = result["timeline_unix"]
    worker_setup = timeline["training_started"] - timeline["process_started"]
    print(f"ray start-up: launcher start to first step {timeline['first_step_done'] - started:.1f} s; "
          f"worker process start to training {worker_setup:.1f} s")
    assert loopback_ray.token_path.read_text() not in launched.stdout + launched.stderr


@pytest.mark.slow
def test_a_run_ray_gives_up_on_ends_with_one_line(loopback_ray, torchrun_reference, make_config, tmp_path):
    """A worker-side error Ray cannot retry away: resuming 2 workers' checkpoint with 1 worker."""
    _, written_by_two = torchrun_reference
    shutil.copytree(written_by_two, tmp_path / "ckpt")
    cfg = make_config(epochs=EPOCHS, checkpoint_dir=str(tmp_path / "ckpt"))
    command = ray_command(loopback_ray, cfg, tmp_path, "--num-workers", "1", "--max-failures", "0")
    launched = subprocess.run(command, env=ray_env(loopback_ray), capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
    assert launched.returncode == 1
    ours = [line for line in launched.stderr.splitlines() if line.startswith(PROG)]
    assert ours == [f"{PROG}: error: Ray gave up after 0 restart(s): trainer.config.ConfigError: "
                    "checkpoint_dir: the checkpoint was written by 2 workers, this run has 1; "
                    "resume with the same world size"]
    assert not (tmp_path / "out" / "result.json").exists()


@pytest.mark.slow
def test_ray_datas_rows_train_as_the_dataloaders_do(loopback_ray, torchrun_reference, make_config, tmp_path):
    """data_path platform: Ray Data's ETL on the driver, every row to both workers; torchrun's epochs."""
    reference, _ = torchrun_reference
    cfg = make_config(epochs=EPOCHS, data_path="platform", platform_data_dir=str(tmp_path / "shared"))
    _, result = two_workers(loopback_ray, cfg, tmp_path)
    assert result["framework_label"] == f"{LABEL} + platform ETL"
    assert result["world_size"] == 2
    assert result["data_fingerprint"] == reference["data_fingerprint"]
    assert_same_epochs(result, reference, same_config=False)
    timeline = result["timeline_unix"]
    assert timeline["etl_started"] < timeline["etl_ended"] <= timeline["data_started"]
    print(f"ray data ETL {timeline['etl_ended'] - timeline['etl_started']:.1f} s; "
          f"the workers' rows {timeline['data_ready'] - timeline['data_started']:.1f} s")


# Ray Data's ETL alone, in a driver of its own (Ray's token is read once a process, so not this one's):
# each split's materialized rows as the workers' hooks take them, saved as the core's arrays.
ETL_DRIVER = """import os, sys
import numpy as np, ray
from trainer import platform_data
from trainer.options import from_dict, load_yaml
from trainer.launchers import _ray_data
address, config, out = sys.argv[1:]
ray.init(address, runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
cfg = from_dict(load_yaml(config))
run, directories = platform_data.etl_run(cfg)
tables = {split: _ray_data.rows_table(rows) for split, rows in _ray_data.ray_etl(cfg, directories).items()}
for split, tokens in platform_data.splits_from_tables(cfg, tables, run.tokens_fingerprint).items():
    np.savez(f"{out}/{split}.npz", ids=tokens.ids, offsets=tokens.offsets, labels=tokens.labels)
print(f"fingerprint: {run.tokens_fingerprint}")
"""


@pytest.mark.slow
def test_ray_datas_etl_gives_the_loaders_tokens(loopback_ray, make_config, tmp_path):
    cfg = make_config(data_path="platform", platform_data_dir=str(tmp_path / "shared"))
    command = [sys.executable, "-c", ETL_DRIVER, loopback_ray.address,
               str(write_config(cfg, tmp_path / "run.yml")), str(tmp_path)]
    etl = subprocess.run(command, env=ray_env(loopback_ray), capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    assert etl.returncode == 0, etl.stdout[-3000:] + etl.stderr[-3000:]
    loader = data.tokenized_splits(make_config())  # the torchrun reference's config: its tokens
    assert f"fingerprint: {loader['train'].fingerprint}" in etl.stdout
    for split in data.SPLITS:
        platform = np.load(tmp_path / f"{split}.npz")
        assert platform["ids"].dtype == loader[split].ids.dtype
        for part in ("ids", "offsets", "labels"):
            assert np.array_equal(platform[part], getattr(loader[split], part)), (split, part)


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "line"), [
    (["--num-workers", "0", "--address", "127.0.0.1:1"],
     "argument --num-workers: must be an integer >= 1, got 0 (--help lists the flags)"),
    (["--num-workers", "2"], "the following arguments are required: --address (--help lists the flags)"),
    (["--max-failures", "-1", "--address", "127.0.0.1:1"],
     "argument --max-failures: must be an integer >= 0, got -1 (--help lists the flags)"),
    (["--address", "auto"], "--address: must be HOST:PORT of Ray's GCS, got 'auto'"),
    # A head that is down: one line at once, not ray.init's minutes of retries.
    (["--address", "127.0.0.1:{closed}"],
     "--address: nothing answers at 127.0.0.1:{closed} (Connection refused); is Ray's GCS running there?"),
])
@pytest.mark.core
def test_bad_flags_fail_with_one_line_before_ray_starts(argv, line, tmp_path):
    closed = free_loopback_port()  # nothing listens there
    argv = [word.format(closed=closed) for word in argv]
    command = [sys.executable, "-m", "trainer.launchers.ray", *argv, "--output-dir", str(tmp_path)]
    started = time.monotonic()
    failed = subprocess.run(command, env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines() == [f"{PROG}: error: {line.format(closed=closed)}"]
    assert time.monotonic() - started < 60  # the import of Ray and torch, no connection retries
    assert not (tmp_path / "ray-run").exists()


@pytest.mark.parametrize("launcher", sorted(p.name for p in LAUNCHERS.glob("[!_]*.py")))
def test_every_launcher_is_thin(launcher):
    """The training core lives once, in trainer.core; a launcher only starts it (ARCHITECTURE.md)."""
    assert len((LAUNCHERS / launcher).read_text().splitlines()) <= 80


RAY_ON_H100 = REPO / "tests" / "fixtures" / "gpu-h100" / "ray-cluster-resources.json"


def test_device_auto_asks_ray_for_gpus_where_a_real_gpu_head_offers_them():
    """Ray 2.60's answers on a real H100 (tests/fixtures/gpu-h100/README.md): the GPU it found by itself,
    and the one offered as the ray role starts a node (CUDA_VISIBLE_DEVICES, --num-gpus). The launcher's
    rule then gives every worker a GPU under auto and cuda; a CPU-only cluster, as the lab's, none."""
    answers = json.loads(RAY_ON_H100.read_text())
    autodetected, as_the_role_starts_it = answers["autodetected"], answers["as_the_role_starts_it"]
    assert autodetected["GPU"] == 1 and autodetected["accelerator_type:H100"] == 1
    offered = as_the_role_starts_it["cluster"]
    assert [node["GPU"] for node in as_the_role_starts_it["nodes"]] == [1.0]  # its one gpu_index
    assert scheduler_gives_gpus("auto", offered.get("GPU", 0))
    assert scheduler_gives_gpus("cuda", offered.get("GPU", 0))
    assert not scheduler_gives_gpus("cpu", offered.get("GPU", 0))
    cpu_only = {key: value for key, value in offered.items() if key not in ("GPU", "accelerator_type:H100")}
    assert not scheduler_gives_gpus("auto", cpu_only.get("GPU", 0))
