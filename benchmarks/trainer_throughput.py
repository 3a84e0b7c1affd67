"""Throughput on CPU: this trainer against Hugging Face's Trainer set up three ways, 1 process x 1 thread.

    .venv/bin/python benchmarks/trainer_throughput.py [--train-size 512] [--max-length 512] [--rounds 3]

Same model (bert-tiny shape, same initial weights), same tokens (generated IMDB-like reviews,
tokenized once), same batch (32), same max length, same optimizer (fused AdamW, lr 5e-5, weight
decay 0.01, linear warmup/decay). Each contender runs in a fresh process; contenders take turns
over --rounds. Each reports the wall time and process CPU time of its training loop alone (after
setup). Ratios are per round (HF contender / dtlab, > 1 means dtlab is faster), min/median/max:

  dtlab       trainer.core.train: dynamic padding, length-grouped batches, no clipping (the protocol)
  hf-example  as HF's text-classification example sets it up: every review padded to max_length,
              random order, its default gradient clipping (max_grad_norm=1.0)
  hf-guide    as the transformers IMDb guide sets it up: dynamic padding (DataCollatorWithPadding),
              random order, default clipping
  hf-best     at its best for this task: group_by_length with a length column, dynamic padding,
              no clipping (max_grad_norm=0), like dtlab's protocol

Targets, by the median CPU-time ratio: dtlab vs hf-example >= 1.5x, vs hf-best >= 1.0x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _trainer_common import OUT_DIR, hf_dataset, hf_tokenizer, machine, spread  # noqa: E402

CONTENDERS = ("dtlab", "hf-example", "hf-guide", "hf-best")
TARGETS = {"hf-example": 1.5, "hf-best": 1.0}


def benchmark_config(args):
    from trainer.config import TrainConfig

    root = OUT_DIR / "trainer_throughput"
    return TrainConfig(model="generated:bert-tiny", dataset="generated", generated_train_size=args.train_size,
                       generated_test_size=32, max_length=args.max_length, batch_size=args.batch_size,
                       epochs=1,
                       learning_rate=5e-5, weight_decay=0.01, warmup_steps=500, device="cpu",
                       mixed_precision="no", threads=1, output_dir=str(root / "out"),
                       cache_dir=str(root / "token-cache")).validate()


def run_dtlab(cfg) -> tuple[float, float]:
    from trainer.core import train

    epoch = train(cfg)["epoch_metrics"][0]
    return epoch["train_time_s"], epoch["train_cpu_time_s"]


def run_hf(cfg, setup: str) -> tuple[float, float]:
    import time

    import torch
    from transformers import (
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        default_data_collator,
    )

    class LoopClock(TrainerCallback):
        """The training loop alone, as trainer.core times it: after setup, until the last step."""

        def on_train_begin(self, *_, **__):
            self.started = time.perf_counter(), time.process_time()

        def on_train_end(self, *_, **__):
            self.seconds = time.perf_counter() - self.started[0], time.process_time() - self.started[1]

    from trainer.data import tokenized_splits
    from trainer.model import build_model

    torch.set_num_threads(cfg.threads)
    split = tokenized_splits(cfg)["train"]
    padded = setup == "hf-example"  # the example's tokenize(padding="max_length", truncation=True)
    dataset = hf_dataset(split, max_length=cfg.max_length if padded else None, with_length=setup == "hf-best")
    tokenizer = hf_tokenizer(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    with tempfile.TemporaryDirectory() as output_dir:
        arguments = TrainingArguments(
            output_dir=output_dir, per_device_train_batch_size=cfg.batch_size, num_train_epochs=1,
            learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps,
            lr_scheduler_type="linear", seed=cfg.seed, use_cpu=True, dataloader_num_workers=0,
            save_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True,
            max_grad_norm=0.0 if setup == "hf-best" else 1.0,  # 1.0: the Trainer's default, kept by both
            train_sampling_strategy="group_by_length" if setup == "hf-best" else "random")
        collator = default_data_collator if padded else DataCollatorWithPadding(tokenizer)
        clock = LoopClock()
        trainer = Trainer(model=model, args=arguments, train_dataset=dataset, processing_class=tokenizer,
                          data_collator=collator, callbacks=[clock])
        trainer.train()
        return clock.seconds


def child(args) -> None:
    cfg = benchmark_config(args)
    if args.contender == "dtlab":
        wall, cpu = run_dtlab(cfg)
    else:
        wall, cpu = run_hf(cfg, args.contender)
    print(json.dumps({"contender": args.contender, "wall_s": wall, "cpu_s": cpu}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-size", type=int, default=512)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)  # one child run
    args = parser.parse_args()
    if args.contender:
        return child(args)

    import numpy as np

    from trainer.data import tokenized_splits

    cfg = benchmark_config(args)
    lengths = tokenized_splits(cfg)["train"].lengths  # tokenize once, outside every timed run
    print(f"machine: {machine()}")
    print(f"data: {cfg.generated_train_size} reviews, tokens per review median {int(np.median(lengths))}, "
          f"mean {lengths.mean():.0f}, max_length {cfg.max_length}, batch {cfg.batch_size}, "
          "1 process x 1 thread")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs: dict[str, list[dict[str, float]]] = {contender: [] for contender in CONTENDERS}
    for round_number in range(1, args.rounds + 1):
        for contender in CONTENDERS:
            completed = subprocess.run(
                [sys.executable, __file__, "--contender", contender, "--train-size", str(args.train_size),
                 "--max-length", str(args.max_length), "--batch-size", str(args.batch_size)],
                env=env, capture_output=True, text=True, timeout=7200)
            if completed.returncode != 0:
                raise SystemExit(f"{contender} failed:\n{completed.stdout[-2000:]}\n"
                                 f"{completed.stderr[-3000:]}")
            measured = json.loads(completed.stdout.strip().splitlines()[-1])
            runs[contender].append(measured)
            samples = cfg.generated_train_size
            print(f"round {round_number} {contender:11s} wall {measured['wall_s']:7.1f} s "
                  f"({samples / measured['wall_s']:6.1f} samples/s)  cpu {measured['cpu_s']:7.1f} s "
                  f"({samples / measured['cpu_s']:6.1f} samples/cpu-s)", flush=True)
    print(f"ratios HF contender / dtlab, per round: median [min-max] over {args.rounds} rounds")
    for contender in CONTENDERS[1:]:
        ratios = {clock: [theirs[clock] / ours[clock] for ours, theirs in zip(runs["dtlab"], runs[contender],
                                                                               strict=True)]
                  for clock in ("wall_s", "cpu_s")}
        line = (f"dtlab vs {contender:10s} CPU time {spread(ratios['cpu_s'], unit='x')}   "
                f"wall time {spread(ratios['wall_s'], unit='x')}")
        if contender in TARGETS:
            met = statistics.median(ratios["cpu_s"]) >= TARGETS[contender]
            verdict = "met" if met else "MISSED"
            line += f"   (target >= {TARGETS[contender]:.1f}x by the median CPU ratio: {verdict})"
        print(line)
    print(f"machine after: {machine()}")


if __name__ == "__main__":
    main()
