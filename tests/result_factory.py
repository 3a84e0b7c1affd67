"""Made-up trainer results for tests (never for the product: `bench.report --study` uses only
what the study published)."""

from __future__ import annotations

from typing import Any


def made_up_result(
    framework: str,
    gpus: int,
    epochs: int,
    seed: int,
    *,
    time_total_s: float,
    final_accuracy: float,
    device: str = "cuda",
    framework_label: str | None = None,
) -> dict[str, Any]:
    """A schema-valid result JSON with the given time and accuracy, every other detail made up
    (hosts, versions, memory, GPU utilisation): for tests of the store and the report only.

    Per-epoch metrics are spread evenly over the run; accuracy rises to the final value.
    """
    epoch_time = time_total_s / epochs
    train_samples = 25_000 // gpus
    return {
        "schema_version": 1,
        "framework": framework,
        "framework_label": framework_label or f"{framework} (study figures)",
        "world_size": gpus,
        "nodes": gpus,
        "gpus": gpus if device == "cuda" else 0,
        "device": device,
        "backend": "nccl" if device == "cuda" else "gloo",
        "hostnames": [f"node{i}" for i in range(1, gpus + 1)],
        "epochs": epochs,
        "seed": seed,
        "hyperparameters": {
            "learning_rate": 5e-5,
            "weight_decay": 0.01,
            "warmup_steps": 500,
            "batch_size_per_worker": 32,
            "max_length": 128,
            "model": "prajjwal1/bert-tiny",
            "dataset": "imdb",
        },
        "config_hash": "0123456789abcdef",
        "time_total_s": time_total_s,
        "epoch_metrics": [
            {
                "epoch": e,
                "train_time_s": epoch_time * 0.9,
                "val_time_s": epoch_time * 0.1,
                "val_loss": 0.4,
                "val_accuracy": final_accuracy * min(1.0, 0.9 + 0.1 * e / epochs),
                "train_samples": train_samples,
            }
            for e in range(1, epochs + 1)
        ],
        "samples_per_s": 25_000 * epochs / time_total_s,
        "peak_memory_mb": {"rss": 1500.0, "cuda": 800.0 if device == "cuda" else None},
        "final_accuracy": final_accuracy,
        "gpu_utilization_pct": 90.0 if device == "cuda" else None,
        "resumed_from_epoch": None,
        "versions": {
            "python": "3.11.7",
            "torch": "2.13.0",
            "transformers": "5.23.0",
            "cuda": "12.2" if device == "cuda" else None,
            "nccl": None,
        },
        "started_at": "2025-10-01T00:00:00+00:00",
        "finished_at": "2025-10-01T01:00:00+00:00",
    }


def made_up_search(cell, wall_s: float = 2.0, best: int = 1, **changes) -> dict:
    """What trainer.search.search_result writes for a search cell (dtlab.cell.Cell with a task_plan): each
    trial one epoch, trial `best` (0-based) the best, the last reached at wall_s; `changes` replace keys."""
    count = len(cell.task_plan["trials"])
    trials = [{"number": n, "options": option, "started": 0.0, "ended": wall_s * (n + 1) / count,
               "error": None, "stopped_early": True,
               "epochs": [{"epoch": 1, "val_accuracy": 0.9 if n == best else 0.5, "ended": 1.0 + n}]}
              for n, option in enumerate(cell.task_plan["trials"])]
    return {"way": "sweep-asha", "label": "sweep (torchrun, one trial at a time)", "metric": "val_accuracy",
            "early_stopping": cell.search, "budget_epochs": cell.epochs, "rungs": [1, 2], "slots": 2,
            "workers_per_trial": 2, "started": 0.0, "ended": wall_s, "wall_s": wall_s, "trials": trials,
            "counts": {"started": len(trials), "stopped_early": len(trials), "failed": 0},
            "best": {"number": best, "options": trials[best]["options"], "val_accuracy": 0.9, "epochs": 1,
                     "reached_s": trials[best]["ended"]}, "busy_fraction": 0.75, **changes}


def made_up_serve(cell, p99_ms: float = 20.0, throughput_rps: float = 100.0, mismatches: int = 0,
                  **changes) -> dict:
    """What dtlab/bench/serve.py records for a serve cell (dtlab.cell.Cell with a task_plan): each planned
    load level with this p99 (p50 half of it) and throughput; `changes` replace keys."""
    levels = [{"concurrency": n, "requests": cell.task_plan["load"]["requests"], "errors": 0,
               "mismatches": mismatches, "p50_ms": p99_ms / 2, "p99_ms": p99_ms,
               "throughput_rps": throughput_rps, "wall_s": 2.5, "first_error": None}
              for n in cell.task_plan["load"]["concurrency"]]
    return {"way": cell.framework, "label": f"{cell.framework} server", "serves": cell.trained.key,
            "checkpoint": "/srv/dtlab-shared/x/checkpoints/epoch-2.pt", "epoch": cell.epochs,
            "accuracy": 0.95, "replicas": cell.gpus, "urls": ["http://10.0.0.11:8100/predict"],
            "levels": levels, "ready_s": 12.0, "wall_s": 30.0, **changes}
