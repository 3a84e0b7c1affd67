"""Scenario C's search, three ways side by side over one plan (issue #54): dtlab's plain sweep (one trial at a
time, no early stopping), the same sweep with dtlab's ASHA rule, and Ray Tune's ASHAScheduler on a loopback
Ray cluster (a head with no CPUs and two 1-CPU workers: two trials at once).

    .venv/bin/python benchmarks/tune.py [--trials 4] [--budget 2] [--train-size 1024] [--rounds 3]

The trials are drawn once (dtlab/search.py) from the smoke profile's options with a loguniform learning rate,
so every way trains the same configurations; the rounds interleave the ways, and the Ray cluster starts once,
before them (Tune's own start, ray.init included, is in its times). Printed per way, min/median/max over the
rounds: the wall time to the end and its ratio to that round's plain sweep, the time to the best trial's last
epoch, the best accuracy, which trial was best in each round, trials stopped early, and the busy fraction
(trial-seconds x workers over slots x wall time, over each way's own slots: the sweeps' one, Tune's two).
A difference within the rounds' spread is marked as such. Run it alone on a quiet machine
(benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trainer_common import OUT_DIR, machine, spread  # noqa: E402

from dtlab import paths  # noqa: E402
from dtlab.search import parse_search  # noqa: E402
from tests.raycluster import RayCluster  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.data import tokenized_splits  # noqa: E402
from trainer.search import SEARCH_FILE_NAME  # noqa: E402

WAYS = (("plain sweep", "trainer.launchers.sweep", "none"),  # the first is the baseline
        ("sweep + dtlab ASHA", "trainer.launchers.sweep", "asha"),
        ("Ray Tune ASHA", "trainer.launchers.ray_tune", "asha"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--budget", type=int, default=2, help="epochs a trial trains at most")
    parser.add_argument("--train-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--seed", type=int, default=0, help="draws the trials")
    args = parser.parse_args()

    root = OUT_DIR / "tune"
    smoke = yaml.safe_load((paths.REPO_ROOT / "experiments/matrix.yml").read_text())["profiles"]["smoke"]
    trainer = {**smoke["trainer"], "generated_train_size": args.train_size}
    spec = parse_search({"space": {"learning_rate": {"loguniform": [1.0e-5, 3.0e-3]}}, "trials": args.trials,
                         "budget_epochs": args.budget, "seed": args.seed}, trainer, "benchmarks/tune.py")
    cfg = TrainConfig(**{**trainer, "device": "cpu", "mixed_precision": "no", "threads": 1,
                         "output_dir": str(root / "out"), "cache_dir": str(root / "token-cache")}).validate()
    tokenized_splits(cfg)  # tokenize once, outside the timed runs
    print(f"machine: {machine()}")
    drawn = spec.trial_options()
    print("trials: " + ", ".join(f"{n}: lr {t['learning_rate']:.2g}" for n, t in enumerate(drawn)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(paths.REPO_ROOT)}
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in WAYS}
    with RayCluster(workers=2, cpus_per_worker=1) as cluster:
        for round_number, (name, module, stopping) in itertools.product(range(1, args.rounds + 1), WAYS):
            tag = f"{module.rsplit('.', 1)[1]}-{stopping}"
            plan, config = root / f"{tag}.json", root / f"{tag}.yml"
            plan.write_text(json.dumps(spec.plan(stopping)))
            config.write_text(yaml.safe_dump({**cfg.as_dict(), "output_dir": str(root / tag)}))
            command = [sys.executable, "-m", module, "--config", str(config), "--search", str(plan)]
            if module.endswith("ray_tune"):
                command += ["--address", cluster.address]
            done = subprocess.run(command, env={**env, **cluster.env}, capture_output=True, text=True,
                                  timeout=3600)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            search = json.loads((root / tag / SEARCH_FILE_NAME).read_text())
            runs[name].append(search)
            print(f"round {round_number} {name:18s} {search['wall_s']:6.1f} s, best trial "
                  f"{search['best']['number']} at {search['best']['reached_s']:6.1f} s, accuracy "
                  f"{search['best']['val_accuracy']:.4f}, {search['counts']['stopped_early']} stopped early, "
                  f"busy {search['busy_fraction']:.2f}", flush=True)
    plain = runs[WAYS[0][0]]
    print(f"\n{'way':18s} | wall s | x plain sweep | to best s | best accuracy | best trial | stopped | busy")
    for name, _, _ in WAYS:
        ours = runs[name]
        ratio = [search["wall_s"] / base["wall_s"] for base, search in zip(plain, ours, strict=True)]
        noise = "" if name == WAYS[0][0] else _noise(plain, ours)
        print(f"{name:18s} | {spread([s['wall_s'] for s in ours], '.1f')} | {spread(ratio)}{noise} | "
              f"{spread([s['best']['reached_s'] for s in ours], '.1f')} | "
              f"{spread([s['best']['val_accuracy'] for s in ours], '.4f')} | "
              f"{sorted({s['best']['number'] for s in ours})} | "
              f"{spread([s['counts']['stopped_early'] for s in ours], '.0f')} | "
              f"{spread([s['busy_fraction'] for s in ours])}")
    print(f"n = {args.rounds} rounds per way, {args.trials} trials of up to {args.budget} epochs each; "
          f"machine after: {machine()}")


def _noise(plain: list[dict], ours: list[dict]) -> str:
    """' (within noise)' when the two ways' wall-time ranges overlap."""
    ranges = [(min(s["wall_s"] for s in runs), max(s["wall_s"] for s in runs)) for runs in (plain, ours)]
    return " (within noise)" if ranges[0][0] <= ranges[1][1] and ranges[1][0] <= ranges[0][1] else ""


if __name__ == "__main__":
    main()
