"""The parallelism strategies side by side: step time, peak memory per worker, bytes sent per step, the
pipeline's measured bubble and final accuracy, per model size, over interleaved rounds.

    .venv/bin/python benchmarks/strategies.py [--sizes bert-tiny,bert-mini,bert-small] [--rounds 3]
    python3 benchmarks/strategies.py --device cuda --world-size 1 --sizes bert-tiny,bert-medium   # a GPU

Every run goes through torchrun with the same config but its strategy (fp32 unless --mixed-precision bf16,
1 thread per worker,
generated IMDB-like reviews, generated BERT shapes, batch --batch-size per worker, so every strategy
trains the same global batch), under benchmarks/_strategy_probe.py: the torchrun launcher's training
plus the bytes each rank sends per step (profiled c10d operations, ring-equivalent) and each pipeline
stage's busy time. Contenders are strategy names; `pipeline:m4` sets 4 microbatches, `pipeline:gpipe`
the GPipe schedule. Each round runs every size and contender once, in the same order.

Printed per size and contender: the steady step time (result.json's median after the first steps),
min/median/max over rounds, and its ratio to ddp's in the same round; peak memory per worker (the
largest rank's RSS on CPU, max_memory_allocated on CUDA); MB sent per step (mean over ranks); the
pipeline's idle fraction (mean over stages) beside the formula (stages - 1) / (microbatches + stages - 1);
final accuracy. A ratio whose min-max range includes 1 is marked "within noise". Figures go to
benchmarks/out/strategies.json, rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _strategy_probe import PROFILE_AFTER_STEPS, PROFILED_STEPS  # noqa: E402
from _trainer_common import OUT_DIR, free_loopback_port, machine, spread  # noqa: E402

from trainer.config import GENERATED_MODEL_PREFIX, GENERATED_MODEL_SHAPES, ConfigError, TrainConfig  # noqa: E402
from trainer.data import tokenized_splits  # noqa: E402
from trainer.strategies import NAMES  # noqa: E402

PROBE = Path(__file__).resolve().parent / "_strategy_probe.py"
BASELINE = "ddp"
DEFAULT_CONTENDERS = ("ddp", "zero1", "fsdp", "fsdp_no_reshard", "tensor", "pipeline", "pipeline:m4")


def contender_options(contender: str) -> dict:
    """'pipeline:gpipe:m4' -> the config keys it sets; one line and exit 2 for a name it cannot be."""
    strategy, *options = contender.split(":")
    if strategy not in NAMES:
        raise SystemExit(f"strategies.py: error: contender {contender!r}: {strategy!r} is not one of "
                         f"{', '.join(NAMES)}")
    settings = {"strategy": strategy}
    for option in options:
        if option in ("gpipe", "1f1b"):
            settings["pipeline_schedule"] = option
        elif option.startswith("m") and option[1:].isdigit():
            settings["microbatches"] = int(option[1:])
        else:
            raise SystemExit(f"strategies.py: error: contender {contender!r}: option {option!r} is neither "
                             "a schedule (gpipe, 1f1b) nor mN (N microbatches)")
    return settings


def run_once(config: dict, world_size: int, work: Path, tag: str) -> dict:
    output = work / tag
    for stale in output.glob("*.json"):  # a failed run must not leave the last round's figures behind
        stale.unlink()
    config_file = work / f"{tag}.yml"
    config_file.write_text(yaml.safe_dump({**config, "output_dir": str(output)}))
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={world_size}",
               "--master_addr=127.0.0.1", f"--master_port={free_loopback_port()}", str(PROBE),
               "--config", str(config_file)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {"failed": (done.stdout + done.stderr)[-2000:]}
    result = json.loads((output / "result.json").read_text())
    probes = [json.loads(path.read_text()) for path in sorted(output.glob("probe-rank*.json"))]
    memory = result["peak_memory_mb"]
    idle = [p["stage_idle_fraction"] for p in probes if p["stage_idle_fraction"] is not None]
    return {"step_ms": result["steady_step_time_s"] * 1000,
            "peak_mb": memory["cuda"] if memory["cuda"] is not None else memory["rss"],  # the largest rank's
            "memory_kind": "CUDA max_memory_allocated" if memory["cuda"] is not None else "RSS",
            "sent_mb_per_step": statistics.mean(p["sent_bytes_per_step"] for p in probes) / 1e6,
            "c10d_calls_per_step": probes[0]["c10d_calls_per_step"],
            "unknown_c10d_ops": sorted({op for p in probes for op in p["unknown_c10d_ops"]}),
            "idle_fraction": statistics.mean(idle) if idle else None,
            "microbatches": result["hyperparameters"].get("microbatches"),  # pipeline's, as used
            "final_accuracy": result["final_accuracy"],
            "epoch_losses": [m["train_loss"] for m in result["epoch_metrics"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="bert-tiny,bert-mini,bert-small",
                        help=f"generated shapes: {', '.join(GENERATED_MODEL_SHAPES)}")
    parser.add_argument("--contenders", default=",".join(DEFAULT_CONTENDERS))
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch-size", type=int, default=8, help="per worker")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24, help="training steps per run (one epoch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mixed-precision", choices=("no", "bf16"), default="no",
                        help="no (fp32, as the equivalence tests) or bf16 autocast")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    for size in sizes:
        if size not in GENERATED_MODEL_SHAPES:
            raise SystemExit(f"strategies.py: error: --sizes: {size!r} is not one of "
                             f"{', '.join(GENERATED_MODEL_SHAPES)}")
    if args.steps < PROFILE_AFTER_STEPS + PROFILED_STEPS:
        raise SystemExit(f"strategies.py: error: --steps {args.steps}: the probe profiles steps "
                         f"{PROFILE_AFTER_STEPS + 1}-{PROFILE_AFTER_STEPS + PROFILED_STEPS}; use at least "
                         f"{PROFILE_AFTER_STEPS + PROFILED_STEPS}")
    contenders = args.contenders.split(",")
    if BASELINE not in contenders:
        raise SystemExit(f"strategies.py: error: --contenders must include {BASELINE}, the ratios' baseline")
    options = {contender: contender_options(contender) for contender in contenders}

    work = OUT_DIR / "strategies"
    global_batch = args.batch_size * args.world_size
    try:
        base = TrainConfig(model=GENERATED_MODEL_PREFIX + sizes[0], dataset="generated",
                           generated_train_size=args.steps * global_batch,
                           generated_test_size=2 * global_batch, max_length=args.max_length,
                           batch_size=args.batch_size, epochs=1, device=args.device,
                           mixed_precision=args.mixed_precision, threads=1,
                           cache_dir=str(work / "token-cache"), output_dir=str(work / "out")).validate()
    except ConfigError as error:
        raise SystemExit(f"strategies.py: error: {error}") from None
    tokenized_splits(base)  # tokenize once, outside the timed runs
    print(f"machine: {machine()}")
    print(f"{args.world_size} workers on {args.device}, batch {args.batch_size} per worker (global "
          f"{global_batch}), max_length {args.max_length}, {args.steps} steps, mixed precision "
          f"{args.mixed_precision}, {args.rounds} rounds",
          flush=True)
    runs: dict[str, dict[str, list[dict]]] = {size: {c: [] for c in contenders} for size in sizes}
    for round_number in range(1, args.rounds + 1):
        for size in sizes:
            for contender in contenders:
                config = {**base.as_dict(), "model": GENERATED_MODEL_PREFIX + size, **options[contender]}
                run = run_once(config, args.world_size, work, f"{size}-{contender.replace(':', '-')}")
                runs[size][contender].append(run)
                print(f"round {round_number} {size:11s} {contender:16s} " + _one_line(run), flush=True)
                (OUT_DIR / "strategies.json").write_text(json.dumps(
                    {"machine": machine(), "args": vars(args), "runs": runs}, indent=1))
    for size in sizes:
        _report(size, runs[size], contenders, args.world_size)
    print(f"machine after: {machine()}")


def _one_line(run: dict) -> str:
    if "failed" in run:
        return "FAILED: " + run["failed"].strip().splitlines()[-1]
    idle = f", idle {run['idle_fraction']:.0%}" if run["idle_fraction"] is not None else ""
    return (f"step {run['step_ms']:7.1f} ms, peak {run['peak_mb']:6.0f} MiB, "
            f"sent {run['sent_mb_per_step']:7.2f} MB/step{idle}, accuracy {run['final_accuracy']:.3f}")


def _report(size: str, runs: dict[str, list[dict]], contenders: list[str], world_size: int) -> None:
    baseline = runs[BASELINE]
    print(f"\n{size}: median [min-max] over rounds; ratio = the contender's step / ddp's in the same round")
    for contender in contenders:
        pairs = [(b, r) for b, r in zip(baseline, runs[contender], strict=True)
                 if "failed" not in b and "failed" not in r]
        if not pairs:
            print(f"  {contender:16s} no complete round")
            continue
        mine = [r for _, r in pairs]
        ratios = [r["step_ms"] / b["step_ms"] for b, r in pairs]
        verdict = ""
        if contender != BASELINE:
            verdict = " (within noise)" if min(ratios) <= 1 <= max(ratios) else ""
            verdict = f", ratio {spread(ratios, unit='x')}{verdict}"
        idle = [r["idle_fraction"] for r in mine if r["idle_fraction"] is not None]
        bubble = ""
        if idle:
            microbatches = mine[0]["microbatches"]
            bubble = (f", idle {spread([100 * i for i in idle], unit='%')} (formula "
                      f"{100 * (world_size - 1) / (microbatches + world_size - 1):.0f}%)")
        unknown = sorted({op for r in mine for op in r["unknown_c10d_ops"]})
        steps = spread([r["step_ms"] for r in mine], unit=" ms")
        print(f"  {contender:16s} n={len(mine)} step {steps}{verdict}, "
              f"peak {statistics.median(r['peak_mb'] for r in mine):.0f} MiB ({mine[0]['memory_kind']}), "
              f"sent {statistics.median(r['sent_mb_per_step'] for r in mine):.2f} MB/step{bubble}, "
              f"accuracy {statistics.median(r['final_accuracy'] for r in mine):.3f}"
              + (f"; uncounted c10d ops: {', '.join(unknown)}" if unknown else ""))



if __name__ == "__main__":
    main()
