"""Scaling and memory: 2 workers against 1: stock DDP, DDP with static_graph, and dtlab's opt-in sparse
embedding sync side by side.

    .venv/bin/python benchmarks/trainer_scaling.py [--train-size 1024] [--max-length 256] [--rounds 3]

Every run goes through torchrun with the same config (batch 32 per worker, 1 thread each,
generated IMDB-like reviews, a bert-tiny-shaped model). Four contenders, interleaved over
--rounds: 1 worker, 2 workers with stock DDP, 2 workers with `ddp_static_graph` (stock DDP told the
graph is static), 2 workers with `sparse_embedding_sync` (only the touched word-embedding rows
all-reduced). Efficiency = (2-worker samples/s) / (2 x 1-worker
samples/s), per round against that round's 1-worker run; min/median/max over rounds. Target
>= 90 %, judged here and not in a test; it needs 2 otherwise idle cores. Also printed: the
CPU-time efficiency (rank 0's CPU seconds per sample), blind to waiting, and peak RSS per worker
(target <= 2 GiB).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trainer_common import OUT_DIR, machine, spread, torchrun  # noqa: E402

from trainer.config import TrainConfig  # noqa: E402
from trainer.data import tokenized_splits  # noqa: E402

# (name, workers, trainer options beyond the shared config)
CONTENDERS = (("1 worker", 1, {}), ("2 workers, stock DDP", 2, {}),
              ("2 workers, DDP static graph", 2, {"ddp_static_graph": True}),
              ("2 workers, sparse embedding sync", 2, {"sparse_embedding_sync": True}))
EFFICIENCY_TARGET = 0.90
RSS_TARGET_MB = 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-size", type=int, default=1024)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    args = parser.parse_args()

    root = OUT_DIR / "trainer_scaling"
    cfg = TrainConfig(model="generated:bert-tiny", dataset="generated", generated_train_size=args.train_size,
                      generated_test_size=64, max_length=args.max_length, batch_size=args.batch_size,
                      epochs=args.epochs, device="cpu", mixed_precision="no", threads=1,
                      output_dir=str(root / "out"), cache_dir=str(root / "token-cache")).validate()
    tokenized_splits(cfg)  # tokenize once, outside the timed runs
    print(f"machine: {machine()}")
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in CONTENDERS}
    for round_number, (name, workers, options) in itertools.product(range(1, args.rounds + 1), CONTENDERS):
        tag = f"{workers}-{'-'.join(options) or 'stock'}"
        config_file = root / f"workers-{tag}.yml"
        config_file.write_text(yaml.safe_dump({**cfg.as_dict(), **options,
                                               "output_dir": str(root / f"out-{tag}")}))
        torchrun(workers, config_file)
        result = json.loads((root / f"out-{tag}" / "result.json").read_text())
        runs[name].append(result)
        rss = ", ".join(f"{mb:.0f}" for mb in result["peak_memory_mb"]["rss_per_rank"])
        print(f"round {round_number} {name:34s} {result['samples_per_s']:6.1f} samples/s, steady step "
              f"{result['steady_step_time_s'] * 1000:4.0f} ms, rank-0 CPU {_cpu_s(result):5.1f} s, "
              f"peak RSS per worker {rss} MiB", flush=True)
    single = runs[CONTENDERS[0][0]]
    print(f"efficiency against 1 worker, per round: median [min-max] over {args.rounds} rounds")
    for name, _, _ in CONTENDERS[1:]:
        pairs = list(zip(single, runs[name], strict=True))  # each round against its own 1-worker run
        wall = [two["samples_per_s"] / (2 * one["samples_per_s"]) for one, two in pairs]
        cpu = [_cpu_s(one) / (2 * _cpu_s(two)) for one, two in pairs]
        verdict = "met" if statistics.median(wall) >= EFFICIENCY_TARGET else "MISSED"
        print(f"{name}: efficiency {spread(wall, '.1%')} (target >= {EFFICIENCY_TARGET:.0%} by the median: "
              f"{verdict}); CPU-time efficiency {spread(cpu, '.1%')}")
    peak_rss = max(max(r["peak_memory_mb"]["rss_per_rank"]) for results in runs.values() for r in results)
    print(f"peak RSS per worker: {peak_rss:.0f} MiB = {peak_rss / RSS_TARGET_MB:.2f} of the 2 GiB target "
          f"({'met' if peak_rss <= RSS_TARGET_MB else 'MISSED'})")
    print(f"machine after: {machine()}")


def _cpu_s(result: dict) -> float:
    return sum(m["train_cpu_time_s"] for m in result["epoch_metrics"])


if __name__ == "__main__":
    main()
