"""result.json: one per run, assembled and written by rank 0, shaped by trainer/result_schema.json.

No torch at import time: the Spark launcher's driver writes results without loading it.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import resource
import socket
import statistics
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from trainer import strategies
from trainer.config import DEFAULT_FRAMEWORK, FRAMEWORK_PATTERN, PIPELINE_SCHEDULES, PLATFORM_DATA_PATH

if TYPE_CHECKING:
    from trainer.config import TrainConfig

SCHEMA_PATH = Path(__file__).with_name("result_schema.json")
RESULT_FILE_NAME = "result.json"
STEADY_STATE_SKIP_STEPS = 3  # the first steps pay for allocation and warm-up


def _step_profile(cfg: TrainConfig, per_rank: list[dict]) -> dict | None:
    """Every rank's profile of the same steady steps, rank by rank; None when not asked (or never reached)."""
    ranks = [entry.get("step_profile") for entry in per_rank]
    if not cfg.profile_steps or not any(ranks):
        return None
    return {"steps": cfg.profile_steps, "skipped_first": STEADY_STATE_SKIP_STEPS, "ranks": ranks}


_COMPRESSION_LABELS = {"fp16": "fp16 gradient compression", "bf16": "bf16 gradient compression",
                       "powersgd": "PowerSGD gradient compression"}


def speed_options_label(cfg: TrainConfig) -> str:
    """The options beyond the study's protocol, as the report shows them beside the framework."""
    label = f" + strategy {cfg.strategy}" if cfg.strategy != strategies.DEFAULT else ""
    label += " + sparse embedding sync (dtlab)" if cfg.sparse_embedding_sync else ""
    label += " + DDP static graph" if cfg.ddp_static_graph else ""
    label += f" + {cfg.grad_accum_steps}-step gradient accumulation" if cfg.grad_accum_steps > 1 else ""
    label += " + step profile" if cfg.profile_steps else ""
    label += f" + {_COMPRESSION_LABELS[cfg.grad_compression]}" if cfg.grad_compression != "none" else ""
    label += " + platform ETL" if cfg.data_path == PLATFORM_DATA_PATH else ""
    return label + (f" + torch.compile ({cfg.compile})" if cfg.compile != "no" else "")


def rank_summary(cuda_peak_mb: float | None, energy: dict, step_profile: dict | None = None) -> dict:
    """What each rank adds to the result (gathered on rank 0): its host, its peak memory, the energy its
    training span used (trainer.energy.EnergyMeter.stop) and its step profile (trainer.step_profile)."""
    return {"host": socket.gethostname(), "rss_mb": _peak_rss_mb(), "cuda_mb": cuda_peak_mb, "energy": energy,
            "step_profile": step_profile}


def energy_summary(per_rank: list[dict]) -> dict:
    """The run's energy: every rank's GPU joules, and each node's CPU package joules once (its first rank's);
    a part is None unless every rank (node) measured it, and why_not then says why."""
    gpu = [entry["energy"]["gpu_j"] for entry in per_rank]
    first_of_node = {entry["host"]: entry for entry in reversed(per_rank)}.values()
    cpu = [entry["energy"]["cpu_package_j"] for entry in first_of_node]
    gpu_j = sum(gpu) if None not in gpu else None
    cpu_j = sum(cpu) if None not in cpu else None
    reasons = dict.fromkeys(entry["energy"]["why_not"] for entry in per_rank if entry["energy"]["why_not"])
    return {"joules": None if gpu_j is None and cpu_j is None else (gpu_j or 0.0) + (cpu_j or 0.0),
            "gpu_j": gpu_j, "cpu_package_j": cpu_j, "why_not": "; ".join(reasons) or None}


def assemble(cfg: TrainConfig, *, launcher_framework: str, launcher_label: str, world_size: int,
             device_type: str, backend: str, config_hash: str, data_fingerprint: str, mixed_precision: str,
             pad_multiple: int, time_total: float, epoch_metrics: list[dict], step_times: list[float],
             gpu_utilization: list[float], per_rank: list[dict], timeline_unix: dict,
             resumed_from: int | None, model_flops_per_epoch: int, device_peak: dict,
             gradient_sync: dict | None = None) -> dict:
    """The run's result.json content, from what the loop measured (`per_rank`: rank_summary of each)."""
    is_cuda = device_type == "cuda"
    hostnames = list(dict.fromkeys(entry["host"] for entry in per_rank))
    train_time = sum(m["train_time_s"] for m in epoch_metrics)
    train_samples = sum(m["train_samples"] for m in epoch_metrics)
    steady = step_times[STEADY_STATE_SKIP_STEPS:] or step_times
    # The launcher's hooks name the framework unless the config names another one.
    framework = cfg.framework if cfg.framework != DEFAULT_FRAMEWORK else launcher_framework
    label = cfg.framework_label or (launcher_label if launcher_framework == framework else framework)
    label += speed_options_label(cfg)
    return {
        "schema_version": 1,
        "framework": framework,
        "framework_label": label,
        "world_size": world_size,
        "nodes": len(hostnames),
        "gpus": world_size if is_cuda else 0,
        "device": device_type,
        "backend": backend,
        "hostnames": hostnames,
        "epochs": cfg.epochs,
        "seed": cfg.seed,
        "hyperparameters": {
            "learning_rate": cfg.learning_rate, "weight_decay": cfg.weight_decay,
            "warmup_steps": cfg.warmup_steps, "batch_size_per_worker": cfg.batch_size,
            "max_length": cfg.max_length, "model": cfg.model, "dataset": cfg.dataset,
            "optimizer": cfg.optimizer, "group_by_length": cfg.group_by_length,
            "mixed_precision": mixed_precision,
            "threads_per_worker": cfg.threads,
            "compile": cfg.compile,
            "pad_to_multiple_of": pad_multiple,
            "sparse_embedding_sync": cfg.sparse_embedding_sync,
            **({"ddp_static_graph": True} if cfg.ddp_static_graph else {}),  # results before it had none
            **({"grad_accum_steps": cfg.grad_accum_steps} if cfg.grad_accum_steps > 1 else {}),
            **({"grad_compression": cfg.grad_compression} if cfg.grad_compression != "none" else {}),
            "strategy": cfg.strategy,
            **_pipeline_options(cfg, world_size),
        },
        "config_hash": config_hash,
        "data_fingerprint": data_fingerprint,
        "config": cfg.as_dict(),
        "time_total_s": time_total,
        "epoch_metrics": epoch_metrics,
        "samples_per_s": train_samples / train_time if train_time else 0.0,
        "model_flops_per_epoch": model_flops_per_epoch,
        "device_peak": device_peak,
        "gradient_sync": gradient_sync,
        "step_profile": _step_profile(cfg, per_rank),
        "energy": energy_summary(per_rank),
        "steady_step_time_s": statistics.median(steady) if steady else None,
        "timeline_unix": timeline_unix,
        "peak_memory_mb": {"rss": max(e["rss_mb"] for e in per_rank),
                           "rss_per_rank": [e["rss_mb"] for e in per_rank],
                           "cuda": max(e["cuda_mb"] for e in per_rank) if is_cuda else None},
        "final_accuracy": epoch_metrics[-1]["val_accuracy"],
        "gpu_utilization_pct": statistics.mean(gpu_utilization) if gpu_utilization else None,
        "resumed_from_epoch": resumed_from,
        "versions": versions(),
        "started_at": _utc(timeline_unix["training_started"]),
        "finished_at": _utc(),
    }


def _pipeline_options(cfg: TrainConfig, world_size: int) -> dict:
    """Strategy pipeline's schedule and microbatches per step as the run used them (the default: one
    microbatch per stage); nothing for the other strategies."""
    if cfg.strategy != "pipeline":
        return {}
    return {"pipeline_schedule": cfg.pipeline_schedule,
            "microbatches": strategies.pipeline_microbatches(cfg, world_size)}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _utc(unix_time: float | None = None) -> str:
    """A Unix time (default: now) as result.json's UTC ISO 8601, to the second."""
    moment = datetime.datetime.now(datetime.UTC) if unix_time is None else (
        datetime.datetime.fromtimestamp(unix_time, datetime.UTC))
    return moment.isoformat(timespec="seconds")


@functools.cache
def load_schema() -> dict:
    """The result schema, with the framework's pattern, the strategy and pipeline schedule enums from their
    homes (trainer.config.FRAMEWORK_PATTERN and PIPELINE_SCHEDULES, trainer.strategies.NAMES)."""
    schema = json.loads(SCHEMA_PATH.read_text())
    schema["properties"]["framework"]["pattern"] = FRAMEWORK_PATTERN
    hyperparameters = schema["properties"]["hyperparameters"]["properties"]
    hyperparameters["strategy"]["enum"] = list(strategies.NAMES)
    hyperparameters["pipeline_schedule"]["enum"] = list(PIPELINE_SCHEDULES)
    return schema


def validate_result(result: dict) -> None:
    """Raise jsonschema.ValidationError if `result` does not follow the schema."""
    import jsonschema

    jsonschema.validate(result, load_schema(), cls=jsonschema.Draft202012Validator)


def write_result(result: dict, output_dir: str | Path) -> Path:
    """Validate, then write atomically, so a reader never sees half a result."""
    validate_result(result)
    return write_json_atomically(result, Path(output_dir) / RESULT_FILE_NAME)


def write_json_atomically(data: dict, final: Path) -> Path:
    """`data` as indented JSON at `final`, through a temporary file beside it: a reader sees all or none."""
    final.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{final.stem}-", suffix=final.suffix, dir=final.parent)
    with os.fdopen(handle, "w") as stream:
        json.dump(data, stream, indent=2)
        stream.write("\n")
    os.replace(temporary, final)
    return final


def versions() -> dict:
    import torch
    import transformers

    cuda = torch.version.cuda if torch.cuda.is_available() else None
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):  # CUDA-only: the NCCL build version
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    # str(): torch.__version__ is a TorchVersion, which pickles by reference, so a driver unpickling the
    # returned result (Spark's, Ray's) would import torch for it (1.06 s each time).
    return {"python": platform.python_version(), "torch": str(torch.__version__),
            "transformers": transformers.__version__, "cuda": cuda, "nccl": nccl, **gpu_description()}


def gpu_description() -> dict:
    """CUDA-only: {"gpu": "NVIDIA H100 80GB HBM3 (sm 9.0)", "driver": "580.159.04"}; None values on CPU."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None, "driver": None}
    major, minor = torch.cuda.get_device_capability()
    driver = None
    try:  # NVML comes with the driver; pynvml (nvidia-ml-py) is its Python binding
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # no binding or no NVML: the driver stays unknown  # noqa: BLE001
        driver = None
    return {"gpu": f"{torch.cuda.get_device_name()} (sm {major}.{minor})", "driver": driver}
