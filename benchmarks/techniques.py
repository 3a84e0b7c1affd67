"""The seeds' scaling techniques against the plain step, side by side: gradient accumulation and gradient
compression on 2 DDP workers (torchrun, gloo, CPU).

    .venv/bin/python benchmarks/techniques.py [--train-size 1024] [--max-length 256] [--epochs 2] [--rounds 3]

Every contender trains the same generated reviews (bert-tiny-shaped model, batch 16 per worker, 1 thread
each) for the same epochs; the rounds interleave the contenders. Printed per contender, min/median/max over
the rounds: samples per second and the ratio to that round's plain run, the all-reduce bytes per optimizer
step (result.json's gradient_sync) and per sample, each as a ratio to plain, and the final validation accuracy
beside plain's. PowerSGD sends its first 2 steps whole (its warm-up), inside its bytes per step.
Accumulation's optimizer step covers 4 micro-batches, so it is compared per sample, not per step; it is also
a 4x larger global batch, which changes the training, not only its speed. A difference within the rounds'
spread is marked as such. Run it alone on a quiet machine (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trainer_common import OUT_DIR, machine, spread, torchrun  # noqa: E402

from trainer.config import TrainConfig  # noqa: E402
from trainer.data import tokenized_splits  # noqa: E402

# (name, trainer options beyond the shared config); the first is the baseline
CONTENDERS = (("plain DDP", {}),
              ("4-step accumulation", {"grad_accum_steps": 4}),
              ("fp16 compression", {"grad_compression": "fp16"}),
              ("bf16 compression", {"grad_compression": "bf16"}),
              ("PowerSGD rank 1", {"grad_compression": "powersgd"}),
              ("PowerSGD rank 4", {"grad_compression": "powersgd", "powersgd_rank": 4}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-size", type=int, default=1024)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    args = parser.parse_args()

    root = OUT_DIR / "techniques"
    cfg = TrainConfig(model="generated:bert-tiny", dataset="generated", generated_train_size=args.train_size,
                      generated_test_size=256, max_length=args.max_length, batch_size=args.batch_size,
                      epochs=args.epochs, warmup_steps=0, device="cpu", mixed_precision="no", threads=1,
                      learning_rate=1e-3,  # the smoke profile's: from random weights 5e-5 stays at chance
                      output_dir=str(root / "out"), cache_dir=str(root / "token-cache")).validate()
    tokenized_splits(cfg)  # tokenize once, outside the timed runs
    print(f"machine: {machine()}")
    runs: dict[str, list[dict]] = {name: [] for name, _ in CONTENDERS}
    for round_number, (name, options) in itertools.product(range(1, args.rounds + 1), CONTENDERS):
        tag = "-".join(f"{key}-{value}" for key, value in options.items()) or "plain"
        config_file = root / f"{tag}.yml"
        config_file.write_text(yaml.safe_dump({**cfg.as_dict(), **options, "output_dir": str(root / tag)}))
        torchrun(2, config_file)
        result = json.loads((root / tag / "result.json").read_text())
        runs[name].append(result)
        print(f"round {round_number} {name:22s} {result['samples_per_s']:6.1f} samples/s, "
              f"{result['gradient_sync']['bytes_per_step'] / 2**20:6.2f} MiB all-reduced per step, "
              f"accuracy {result['final_accuracy']:.4f}", flush=True)
    plain = runs[CONTENDERS[0][0]]
    print(f"\n{'contender':22s} | samples/s x plain | bytes per step x plain | bytes per sample x plain"
          " | accuracy (plain's)")
    for name, _ in CONTENDERS:
        pairs = list(zip(plain, runs[name], strict=True))  # each round against its own plain run
        speed = [ours["samples_per_s"] / base["samples_per_s"] for base, ours in pairs]
        sent = [ours["gradient_sync"]["bytes_per_step"] / base["gradient_sync"]["bytes_per_step"]
                for base, ours in pairs]
        per_sample = [ratio / ours["hyperparameters"].get("grad_accum_steps", 1)
                      for ratio, (_, ours) in zip(sent, pairs, strict=True)]
        accuracy = [ours["final_accuracy"] for ours in runs[name]]
        noise = "" if name == CONTENDERS[0][0] else _noise(plain, runs[name])
        print(f"{name:22s} | {spread(speed)}{noise} | {spread(sent)} | {spread(per_sample)} | "
              f"{spread(accuracy, '.4f')} "
              f"({spread([r['final_accuracy'] for r in plain], '.4f')})")
    print(f"n = {args.rounds} rounds per contender; machine after: {machine()}")


def _noise(plain: list[dict], ours: list[dict]) -> str:
    """' (within noise)' when the two contenders' samples/s ranges overlap."""
    ranges = [(min(r["samples_per_s"] for r in runs), max(r["samples_per_s"] for r in runs))
              for runs in (plain, ours)]
    overlap = ranges[0][0] <= ranges[1][1] and ranges[1][0] <= ranges[0][1]
    return " (within noise)" if overlap else ""


if __name__ == "__main__":
    main()
