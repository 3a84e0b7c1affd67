"""Scenario C's serving, two ways side by side over one checkpoint (issue #54): the plain baseline (one
FastAPI + uvicorn process per worker, trainer.launchers.serve) and Ray Serve (trainer.launchers.ray_serve: a
replica on each worker of a loopback Ray cluster, a head with no CPUs and two 1-CPU workers, behind the
head's proxy), loaded by dtlab's load test (dtlab/loadtest.py) at each concurrency.

    .venv/bin/python benchmarks/serve.py [--rounds 3] [--requests 256] [--concurrency 1 8 32]

One run of the smoke profile's options is trained first (one process, its checkpoint kept), and the trainer's
own evaluation of its test split gives every review's expected label. The rounds interleave the ways; each
round starts the way's servers afresh (the time until every server answers is printed as "ready s"; Ray
Serve's includes ray.init and its controller's start, the cluster itself starts once, before the rounds).
Printed per way and concurrency, min/median/max over the rounds: p50 and p99 latency, throughput, and its
ratio to that round's plain servers; errors and answers unlike the trainer's are summed. A difference within
the rounds' spread is marked as such. The load generator runs on the same cores as the servers (on the lab
too: the controller is the host). Run it alone on a quiet machine (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trainer_common import OUT_DIR, free_loopback_port, machine, spread  # noqa: E402

from dtlab import paths  # noqa: E402
from dtlab.loadtest import cluster_targets, load_test, wait_ready  # noqa: E402
from dtlab.matrix.tasks import LoadPlan  # noqa: E402
from tests.raycluster import RayCluster  # noqa: E402
from tests.trainer.conftest import running  # noqa: E402
from trainer.config import PREDICT_PATH, TrainConfig  # noqa: E402
from trainer.core import train  # noqa: E402
from trainer.data import generate_imdb_like  # noqa: E402
from trainer.serving import Predictor, expected_predictions  # noqa: E402

LOOPBACK = "127.0.0.1"
WAYS = ("plain FastAPI+uvicorn", "Ray Serve")  # the first is the baseline
WORKERS = 2
READY_TIMEOUT_S = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--requests", type=int, default=256, help="per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    plan = LoadPlan.from_dict({"concurrency": args.concurrency, "requests": args.requests},
                              "benchmarks/serve.py")

    root = OUT_DIR / "serve"
    smoke = yaml.safe_load((paths.REPO_ROOT / "experiments/matrix.yml").read_text())["profiles"]["smoke"]
    cfg = TrainConfig(**{**smoke["trainer"], "epochs": 1, "device": "cpu", "mixed_precision": "no",
                         "threads": 1, "output_dir": str(root / "out"),
                         "cache_dir": str(root / "token-cache"),
                         "checkpoint_dir": str(root / "checkpoints")}).validate()
    shutil.rmtree(cfg.checkpoint_dir, ignore_errors=True)  # this run's checkpoint is the one served
    os.environ.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    train(cfg)
    expected = expected_predictions(Predictor(cfg))
    reviews = list(generate_imdb_like(cfg.generated_seed, cfg.generated_train_size, cfg.generated_test_size,
                                      cfg.generated_median_words)["test"]["text"])
    config = root / "run.yml"
    config.write_text(yaml.safe_dump(cfg.as_dict()))
    print(f"machine: {machine()}")
    print(f"checkpoint: epoch {expected['epoch']}, the trainer's accuracy {expected['accuracy']:.4f} on "
          f"{len(reviews)} reviews; {plan.requests} requests (one review each) per level")
    env = {**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)}
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    with RayCluster(workers=WORKERS, cpus_per_worker=1) as cluster:
        for round_number, way in itertools.product(range(1, args.rounds + 1), WAYS):
            ports = [free_loopback_port() for _ in range(WORKERS if way == WAYS[0] else 1)]
            commands = [[sys.executable, "-m", "trainer.launchers.serve", "--config", str(config),
                         "--host", LOOPBACK, "--port", str(port)] for port in ports] if way == WAYS[0] else [
                [sys.executable, "-m", "trainer.launchers.ray_serve", "--config", str(config), "--address",
                 cluster.address, "--host", LOOPBACK, "--port", str(ports[0]), "--replicas", str(WORKERS),
                 "--proxies", "head"]]
            targets = cluster_targets([f"http://{LOOPBACK}:{port}{PREDICT_PATH}" for port in ports],
                                      {LOOPBACK}, where="benchmarks/serve.py")
            with contextlib.ExitStack() as stack:
                started = time.perf_counter()
                for command in commands:
                    stack.enter_context(running(command, {**env, **cluster.env}, stdout=subprocess.DEVNULL))
                wait_ready(targets, reviews[0], READY_TIMEOUT_S)
                ready_s = time.perf_counter() - started
                levels = load_test(targets, reviews, expected["labels"], plan)
            runs[way].append({"ready_s": ready_s, "levels": levels})
            print(f"round {round_number} {way:22s} ready {ready_s:5.1f} s | " + " | ".join(
                f"c{level['concurrency']}: p50 {level['p50_ms']:.1f} ms p99 {level['p99_ms']:.1f} ms "
                f"{level['throughput_rps']:.0f}/s err {level['errors']} diff {level['mismatches']}"
                for level in levels), flush=True)
    _summary(runs, plan)
    print(f"n = {args.rounds} rounds per way; machine after: {machine()}")


def _summary(runs: dict[str, list[dict]], plan: LoadPlan) -> None:
    plain = runs[WAYS[0]]
    print(f"\n{'way':22s} | {'ready s':16s} | conc. | p50 ms | p99 ms | requests/s | x plain | errors | "
          "unlike trainer")
    for way, level_index in itertools.product(WAYS, range(len(plan.concurrency))):
        levels = [one["levels"][level_index] for one in runs[way]]
        base = [one["levels"][level_index] for one in plain]
        ratio = [ours["throughput_rps"] / theirs["throughput_rps"]
                 for ours, theirs in zip(levels, base, strict=True)]
        noise = "" if way == WAYS[0] else _noise([b["throughput_rps"] for b in base],
                                                  [o["throughput_rps"] for o in levels])
        ready = spread([one["ready_s"] for one in runs[way]], ".1f") if level_index == 0 else ""
        print(f"{way:22s} | {ready:16s} | {plan.concurrency[level_index]:5d} | "
              f"{spread([o['p50_ms'] for o in levels], '.1f')} | "
              f"{spread([o['p99_ms'] for o in levels], '.1f')} | "
              f"{spread([o['throughput_rps'] for o in levels], '.0f')} | {spread(ratio)}{noise} | "
              f"{sum(o['errors'] for o in levels)} | {sum(o['mismatches'] for o in levels)}")


def _noise(left: list[float], right: list[float]) -> str:
    """' (within noise)' when the two ways' ranges overlap."""
    return " (within noise)" if min(left) <= max(right) and min(right) <= max(left) else ""


if __name__ == "__main__":
    main()
