"""Serving a trained run for real (issue #54): a 2-rank torchrun run's checkpoint served by the plain
baseline (two uvicorn processes, one a "worker") and by Ray Serve on a loopback Ray cluster (two 1-CPU
workers, a replica on each), loaded by dtlab's load test at concurrency 1, 8 and 32. Every answer equals
the trainer's own evaluation of the same review, and that evaluation is the one the run recorded."""

import contextlib
import json
import sys
from pathlib import Path

import pytest

from dtlab.loadtest import cluster_targets, load_test, wait_ready
from dtlab.matrix.tasks import LoadPlan
from tests.raycluster import RayCluster
from tests.trainer.conftest import (
    TINY,
    free_loopback_port,
    run,
    running,
    torchrun_command,
    trainer_env,
    write_config,
)
from trainer.config import PREDICT_PATH, TrainConfig
from trainer.data import generate_imdb_like
from trainer.serving import Predictor, expected_predictions

pytestmark = pytest.mark.slow  # a 2-rank training run, two servers, Ray Serve (~3 min on 2 cores)

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
PLAN = LoadPlan(concurrency=(1, 8, 32), requests=64, timeout_s=60)
READY_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def trained(tmp_path_factory, token_cache) -> tuple[TrainConfig, Path, dict]:
    """(the run's config, its YAML, the trainer's own evaluation of its test split)."""
    root = tmp_path_factory.mktemp("served")
    cfg = TrainConfig(**{**TINY, "generated_train_size": 1024, "output_dir": str(root / "out"),
                         "cache_dir": str(token_cache),
                         "checkpoint_dir": str(root / "checkpoints")}).validate()
    config = write_config(cfg, root / "run.yml")
    run(torchrun_command(2, "--config", str(config)))
    return cfg, config, expected_predictions(Predictor(cfg))


def test_the_trainers_evaluation_of_the_checkpoint_is_the_accuracy_the_run_recorded(trained):
    cfg, _, expected = trained
    recorded = json.loads((Path(cfg.output_dir) / "result.json").read_text())
    assert expected["epoch"] == cfg.epochs
    assert len(expected["labels"]) == len(reviews(cfg)) == cfg.generated_test_size
    assert expected["accuracy"] == recorded["epoch_metrics"][-1]["val_accuracy"]  # the same batches, exactly
    assert 0.5 < expected["accuracy"] < 1  # trained past chance, and not every label alike


def reviews(cfg: TrainConfig) -> list[str]:
    """The test split's raw reviews, as the controller holds them."""
    return list(generate_imdb_like(cfg.generated_seed, cfg.generated_train_size, cfg.generated_test_size,
                                   cfg.generated_median_words)["test"]["text"])


def test_the_expected_launcher_writes_the_trainers_answers_for_the_first_reviews(trained, tmp_path):
    """What bench's serve step fetches from a node (trainer.launchers.expected): the same labels and the
    same raw reviews the controller would compute here."""
    cfg, config, expected = trained
    out = tmp_path / "expected.json"
    run([sys.executable, "-m", "trainer.launchers.expected", "--config", str(config), "--reviews", "50",
         "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["texts"] == reviews(cfg)[:50] and written["labels"] == expected["labels"][:50]
    assert (written["accuracy"], written["epoch"]) == (expected["accuracy"], expected["epoch"])


def assert_every_answer_is_the_trainers(levels: list[dict]) -> None:
    assert [level["concurrency"] for level in levels] == list(PLAN.concurrency)
    for level in levels:
        assert level["errors"] == 0, level
        assert level["mismatches"] == 0, level
        assert 0 < level["p50_ms"] <= level["p99_ms"] and level["throughput_rps"] > 0, level


def test_the_plain_server_on_two_workers_answers_every_request_as_the_trainer_does(trained, tmp_path):
    cfg, config, expected = trained
    ports = [free_loopback_port(), free_loopback_port()]
    env = {**trainer_env(), "PYTHONPATH": str(REPO)}
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(running(
            [sys.executable, "-m", "trainer.launchers.serve", "--config", str(config), "--host", LOOPBACK,
             "--port", str(port)], env)) for port in ports]
        targets = cluster_targets([f"http://{LOOPBACK}:{port}{PREDICT_PATH}" for port in ports], {LOOPBACK},
                                  where="serve")
        texts = reviews(cfg)
        wait_ready(targets, texts[0], READY_TIMEOUT_S)
        levels = load_test(targets, texts, expected["labels"], PLAN)
        assert all(server.poll() is None for server in servers)
    assert_every_answer_is_the_trainers(levels)


def test_ray_serve_puts_a_replica_on_each_worker_and_answers_as_the_trainer_does(trained, loopback_ray,
                                                                                tmp_path):
    cfg, config, expected = trained
    port = free_loopback_port()
    env = {**trainer_env(), **loopback_ray.env, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "trainer.launchers.ray_serve", "--config", str(config),
               "--address", loopback_ray.address, "--host", LOOPBACK, "--port", str(port), "--replicas", "2",
               "--proxies", "head"]  # the loopback cluster's nodes share one address: one proxy
    # Its output to a file: Serve logs every request to the driver, and a pipe that nobody reads while the
    # load runs would fill and block it.
    log = tmp_path / "ray_serve.log"
    # A second Ray on the machine, as a lab node's head is in the full tier: the launcher asks its own
    # cluster, where Ray's State API left to itself finds two and gives up.
    with RayCluster(workers=0), log.open("w") as sink, running(command, env, stdout=sink) as server:
        targets = cluster_targets([f"http://{LOOPBACK}:{port}{PREDICT_PATH}"], {LOOPBACK}, where="serve")
        texts = reviews(cfg)
        wait_ready(targets, texts[0], READY_TIMEOUT_S)
        levels = load_test(targets, texts, expected["labels"], PLAN)
        assert server.poll() is None
    output = log.read_text()
    assert "replicas on 2 workers" in output, output[-3000:]
    assert_every_answer_is_the_trainers(levels)


def test_a_run_with_no_checkpoint_is_refused_in_one_line_before_the_server_listens(trained, tmp_path):
    cfg, _, _ = trained
    empty = TrainConfig(**{**cfg.as_dict(), "checkpoint_dir": str(tmp_path / "none")}).validate()
    answer = run([sys.executable, "-m", "trainer.launchers.serve", "--config",
                  str(write_config(empty, tmp_path / "run.yml")), "--host", LOOPBACK, "--port", "1"],
                 check=False)
    assert answer.returncode == 2
    assert answer.stderr.strip().splitlines() == [
        f"python -m trainer.launchers.serve: error: checkpoint_dir: no checkpoint in {tmp_path / 'none'}; "
        "train the run first"]
