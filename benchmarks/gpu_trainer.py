"""The trainer on one GPU at the study's shapes, against Hugging Face's Trainer, and its distance to the GPU.

    python benchmarks/gpu_trainer.py                      # one command, on any machine with an NVIDIA GPU
    python benchmarks/gpu_trainer.py --rounds 3 --contenders dtlab-fp32,hf-fp32 --no-ceiling

Data: generated IMDB-like reviews (25,000 train and 25,000 test, median ~230 words, IMDB's long tail),
max_length 512, batch 32, a bert-tiny-shaped model (random weights), AdamW lr 5e-5, weight decay
0.01, 500 warmup steps; tokenized once before anything is timed.

Part 1, speed. Each contender runs --epochs epochs in a fresh process; contenders are interleaved over
--rounds. The last epoch counts (the first pays for CUDA warm-up and compilation). Per contender:
training samples/s, and s/epoch = training + validation on the 25,000 test reviews (the study's
per-epoch figure, time_total / epochs). Ratios compare a dtlab contender with the HF Trainer of the
same precision round by round; min/median/max over rounds.

  dtlab-<precision>[-compile|-cudagraphs]  trainer.core.train (torch.compile default / reduce-overhead)
  hf-<precision>[-cudnnattn]               transformers.Trainer at its best for this task:
                                           group_by_length with a length column, dynamic padding,
                                           no gradient clipping (max_grad_norm=0), fused AdamW,
                                           2 loader processes with pinned memory, eval every epoch,
                                           cuDNN's attention off as the trainer has it (-cudnnattn:
                                           torch's default, which plans anew for each batch width)

Part 2, the ceiling: one process per variant. After a warm-up epoch: the step time as the trainer
runs it (unsynchronised), the same step split into data (next batch + copy to the GPU), forward,
backward and optimizer with a synchronisation after each phase, and the GPU's kernel time per step
from torch.profiler. GPU busy = kernel time / unsynchronised step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _gpu_ceiling import measure_ceiling, synchronize  # noqa: E402
from _trainer_common import OUT_DIR, hf_dataset, hf_tokenizer, machine, spread  # noqa: E402

STUDY_GTX_1060_S_PER_EPOCH = 33.86  # Table 5.4, DDP on 1 GPU, 20 epochs (real IMDB, fp32)
PRECISIONS = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
COMPILE_SUFFIXES = {"": "no", "-compile": "default", "-cudagraphs": "reduce-overhead"}
CUDNN_ATTENTION_SUFFIX = "-cudnnattn"  # hf only: torch's default attention choice (the trainer's is off)
DEFAULT_CONTENDERS = "dtlab-fp32,hf-fp32,dtlab-bf16,hf-bf16,dtlab-bf16-compile,dtlab-bf16-cudagraphs"
# name: (precision, compile, loader processes, fused AdamW)
CEILING_VARIANTS = {
    "eager fp32": ("fp32", "no", None, True),
    "eager bf16": ("bf16", "no", None, True),
    "eager bf16 loader in-process": ("bf16", "no", 0, True),
    "eager bf16 foreach AdamW": ("bf16", "no", None, False),
    "compile bf16": ("bf16", "default", None, True),
    "cudagraphs bf16": ("bf16", "reduce-overhead", None, True),
}


def parse_contender(name: str) -> tuple[str, str, str]:
    """'dtlab-bf16-compile' -> ('dtlab', 'bf16', 'default'); SystemExit with one line if unknown.
    'hf-bf16-cudnnattn' -> ('hf', 'bf16', 'no'): see cudnn_attention()."""
    if name.startswith("hf-") and name.endswith(CUDNN_ATTENTION_SUFFIX):
        name = name.removesuffix(CUDNN_ATTENTION_SUFFIX)
    kind, _, rest = name.partition("-")
    precision, _, suffix = rest.partition("-")
    compile_mode = COMPILE_SUFFIXES.get(f"-{suffix}" if suffix else "")
    if (
        kind not in ("dtlab", "hf")
        or precision not in PRECISIONS
        or compile_mode is None
        or (kind == "hf" and compile_mode != "no")
    ):
        raise SystemExit(f"gpu_trainer: unknown contender {name!r}; e.g. {DEFAULT_CONTENDERS}")
    return kind, precision, compile_mode


def cudnn_attention(name: str) -> bool:
    """Whether the contender leaves torch's cuDNN attention on (its default on Hopper with bf16)."""
    return name.endswith(CUDNN_ATTENTION_SUFFIX)


def benchmark_config(args, precision: str = "fp32", compile_mode: str = "no", num_workers=None):
    from trainer.config import TrainConfig

    root = OUT_DIR / "gpu_trainer"
    return TrainConfig(
        model="generated:bert-tiny",
        dataset="generated",
        generated_train_size=args.train_size,
        generated_test_size=args.test_size,
        max_length=args.max_length,
        batch_size=args.batch_size,
        epochs=args.epochs,
        learning_rate=5e-5,
        weight_decay=0.01,
        warmup_steps=500,
        device=args.device,
        mixed_precision=PRECISIONS[precision],
        compile=compile_mode,
        num_workers=num_workers,
        threads=1,
        output_dir=tempfile.mkdtemp(prefix="run-", dir=root),
        cache_dir=str(root / "token-cache"),
    ).validate()


# --- part 1: one contender in this process -----------------------------------------------------


def run_dtlab(args, precision: str, compile_mode: str) -> dict:
    from trainer.core import train

    result = train(benchmark_config(args, precision, compile_mode))
    last = result["epoch_metrics"][-1]
    return {
        "train_s": last["train_time_s"],
        "epoch_s": last["train_time_s"] + last["val_time_s"],
        "samples": last["train_samples"],
        "accuracy": last["val_accuracy"],
        "gpu_util_pct": result["gpu_utilization_pct"],
        "peak_cuda_mb": result["peak_memory_mb"]["cuda"],
        "versions": result["versions"],
    }


def run_hf(args, precision: str, cudnn_attention_on: bool = False) -> dict:
    import numpy as np
    import torch
    from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments

    from trainer.model import build_model

    class EpochClock(TrainerCallback):
        """Synchronised marks: epoch begin, end of its training steps, and the end of the run."""

        def __init__(self):
            self.marks: list[tuple[str, float]] = []

        def _mark(self, name):
            synchronize()
            self.marks.append((name, time.perf_counter()))

        def on_epoch_begin(self, *_, **__):
            self._mark("begin")

        def on_epoch_end(self, *_, **__):
            self._mark("trained")

        def on_train_end(self, *_, **__):
            self._mark("end")

    cfg = benchmark_config(args, precision)
    torch.set_num_threads(cfg.threads)
    # The trainer turns cuDNN's attention off while it trains (trainer/README.md); HF at its best too
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention_on)
    train_set, test_set = hf_splits(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    clock = EpochClock()
    with tempfile.TemporaryDirectory() as output_dir:
        arguments = TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=cfg.batch_size,
            per_device_eval_batch_size=cfg.batch_size,
            num_train_epochs=cfg.epochs,
            learning_rate=cfg.learning_rate,
            weight_decay=cfg.weight_decay,
            warmup_steps=cfg.warmup_steps,
            lr_scheduler_type="linear",
            seed=cfg.seed,
            optim="adamw_torch_fused",
            max_grad_norm=0.0,
            bf16=precision == "bf16",
            fp16=precision == "fp16",
            train_sampling_strategy="group_by_length",
            dataloader_num_workers=2,
            dataloader_pin_memory=True,
            dataloader_persistent_workers=True,
            eval_strategy="epoch",
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            disable_tqdm=True,
        )
        tokenizer = hf_tokenizer(cfg)
        trainer = Trainer(
            model=model,
            args=arguments,
            train_dataset=train_set,
            eval_dataset=test_set,
            processing_class=tokenizer,
            data_collator=DataCollatorWithPadding(tokenizer),
            compute_metrics=lambda p: {
                "accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())
            },
            callbacks=[clock],
        )
        trainer.train()
        accuracy = [
            entry["eval_accuracy"] for entry in trainer.state.log_history if "eval_accuracy" in entry
        ][-1]
    begins = [t for name, t in clock.marks if name == "begin"]
    trained = [t for name, t in clock.marks if name == "trained"]
    ends = begins[1:] + [t for name, t in clock.marks if name == "end"]
    return {
        "train_s": trained[-1] - begins[-1],
        "epoch_s": ends[-1] - begins[-1],
        "samples": len(train_set),
        "accuracy": accuracy,
        "gpu_util_pct": None,
        "peak_cuda_mb": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
    }


def hf_splits(cfg):
    """The token cache as the HF Trainer's datasets, built once and memory-mapped after (setup, not timed)."""
    import datasets

    from trainer.data import tokenized_splits

    saved = (
        Path(cfg.token_cache_dir)
        / f"hf-{cfg.generated_train_size}-{cfg.generated_test_size}-{cfg.max_length}"
    )
    if not saved.exists():
        splits = tokenized_splits(cfg)
        datasets.DatasetDict(
            {"train": hf_dataset(splits["train"], with_length=True), "test": hf_dataset(splits["test"])}
        ).save_to_disk(str(saved))
    loaded = datasets.load_from_disk(str(saved))
    return loaded["train"], loaded["test"]


# --- part 2: one ceiling variant in this process ---------------------------------------------


def run_ceiling(args, variant: str) -> dict:
    precision, compile_mode, num_workers, fused = CEILING_VARIANTS[variant]
    cfg = benchmark_config(args, precision, compile_mode, num_workers)
    return measure_ceiling(cfg, fused, args.ceiling_steps)


# --- the parent: data once, children, tables ------------------------------------------------------


def child_command(args, *extra: str) -> list[str]:
    return [
        sys.executable,
        __file__,
        "--train-size",
        str(args.train_size),
        "--test-size",
        str(args.test_size),
        "--max-length",
        str(args.max_length),
        "--batch-size",
        str(args.batch_size),
        "--epochs",
        str(args.epochs),
        "--device",
        args.device,
        "--ceiling-steps",
        str(args.ceiling_steps),
        *extra,
    ]


def run_child(args, *extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    completed = subprocess.run(
        child_command(args, *extra), env=env, capture_output=True, text=True, timeout=args.child_timeout
    )
    if completed.returncode != 0:
        raise SystemExit(
            f"gpu_trainer: {' '.join(extra)} failed:\n{completed.stdout[-2000:]}\n"
            f"{completed.stderr[-4000:]}"
        )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def save(args, report: dict) -> None:
    """Written after every child process, so a run cut short keeps what it measured."""
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))


def describe_gpu() -> dict:
    import platform

    import torch
    import transformers

    from trainer.result import gpu_description

    return {
        "machine": machine(),
        **gpu_description(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def speed(args, contenders: list[str], report: dict) -> None:
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    report["speed"] = runs
    for round_number in range(1, args.rounds + 1):
        for name in contenders:
            measured = run_child(args, "--contender", name)
            runs[name].append(measured)
            save(args, report)
            print(
                f"round {round_number} {name:22s} train {measured['samples'] / measured['train_s']:8.0f} "
                f"samples/s  epoch {measured['epoch_s']:6.2f} s  accuracy {measured['accuracy']}",
                flush=True,
            )
    print(f"\nspeed, last of {args.epochs} epochs, median [min-max] over {args.rounds} rounds:")
    print(
        f"{'contender':24s} {'train samples/s':>26s} {'s/epoch (train+val)':>24s}  vs HF same precision "
        "(samples/s ratio)"
    )
    for name in contenders:
        kind, precision, _ = parse_contender(name)
        rates = [m["samples"] / m["train_s"] for m in runs[name]]
        ratio = "-"
        if kind == "dtlab" and f"hf-{precision}" in runs:
            ratio = (
                spread(
                    [
                        mine["samples"] / mine["train_s"] / (hf["samples"] / hf["train_s"])
                        for mine, hf in zip(runs[name], runs[f"hf-{precision}"], strict=True)
                    ]
                )
                + "x"
            )
        print(
            f"{name:24s} {spread(rates, '.0f'):>26s} {spread([m['epoch_s'] for m in runs[name]]):>24s}"
            f"  {ratio}"
        )
    print(
        f"{'study: GTX 1060, DDP 1 GPU':24s} {'-':>26s} {STUDY_GTX_1060_S_PER_EPOCH:>24.2f}  "
        "(a different GPU, real IMDB, fp32)"
    )


def ceiling(args, report: dict) -> None:
    report["ceiling"] = {}
    print("\nceiling, ms per step (mean over the measured steps):")
    print(
        f"{'variant':32s} {'step':>7s} {'data':>7s} {'fwd':>7s} {'bwd':>7s} {'optim':>7s} {'sum':>7s} "
        f"{'kernels':>8s} {'GPU busy':>9s}"
    )
    for variant, (precision, compile_mode, _, _) in CEILING_VARIANTS.items():
        if args.variants and variant not in args.variants.split(","):
            continue
        if args.device == "cpu" and (precision != "fp32" or compile_mode != "no"):
            continue  # a trial of the script itself: CUDA-only variants have nothing to say on a CPU
        measured = run_child(args, "--ceiling", variant)
        report["ceiling"][variant] = measured
        save(args, report)
        phases = measured["phases_ms"]
        kernel = measured["kernel_ms"]
        busy = f"{100 * kernel / measured['step_ms']:8.0f}%" if kernel else f"{'-':>9s}"
        print(
            f"{variant:32s} {measured['step_ms']:7.2f} "
            + " ".join(f"{v:7.2f}" for v in phases.values())
            + f" {sum(phases.values()):7.2f} {kernel or 0:8.2f} {busy}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train-size", type=int, default=25_000)
    parser.add_argument("--test-size", type=int, default=25_000)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2, help="per run; the last one counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default=DEFAULT_CONTENDERS, help="comma-separated")
    parser.add_argument("--ceiling-steps", type=int, default=200, help="steps per ceiling measurement")
    parser.add_argument(
        "--variants", help=f"comma-separated ceiling variants (default: all of {', '.join(CEILING_VARIANTS)})"
    )
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--no-ceiling", action="store_true")
    parser.add_argument(
        "--device", default="cuda", help="cuda; cpu only to try the script itself on small sizes"
    )
    parser.add_argument(
        "--json", type=Path, default=OUT_DIR / "gpu_trainer.json", help="where the figures go"
    )
    parser.add_argument("--child-timeout", type=int, default=1800)
    parser.add_argument("--contender", help=argparse.SUPPRESS)  # one child run
    parser.add_argument("--ceiling", help=argparse.SUPPRESS, choices=CEILING_VARIANTS)
    args = parser.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # nothing here may reach a hub
    (OUT_DIR / "gpu_trainer").mkdir(parents=True, exist_ok=True)
    if args.contender:
        kind, precision, compile_mode = parse_contender(args.contender)
        measured = (
            run_dtlab(args, precision, compile_mode)
            if kind == "dtlab"
            else run_hf(args, precision, cudnn_attention(args.contender))
        )
        print(json.dumps(measured))
        return
    if args.ceiling:
        print(json.dumps(run_ceiling(args, args.ceiling)))
        return

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_trainer: torch sees no CUDA GPU here; this benchmark needs one")
    contenders = [name.strip() for name in args.contenders.split(",") if name.strip()]
    for name in contenders:
        parse_contender(name)
    from trainer.data import tokenized_splits

    started = time.perf_counter()
    lengths = tokenized_splits(benchmark_config(args))["train"].lengths  # tokenize once, before any timing
    report = {"gpu": describe_gpu(), "args": {k: str(v) for k, v in vars(args).items()}}
    print(f"gpu: {report['gpu']}")
    print(
        f"data: {args.train_size} train / {args.test_size} test reviews, tokens per review median "
        f"{int(statistics.median(lengths))}, mean {lengths.mean():.0f}, max_length {args.max_length}, "
        f"batch {args.batch_size} (tokenized in {time.perf_counter() - started:.0f} s)",
        flush=True,
    )
    if not args.no_speed:
        speed(args, contenders, report)
    if not args.no_ceiling:
        ceiling(args, report)
    save(args, report)
    print(f"\nfigures: {args.json}")


if __name__ == "__main__":
    main()
