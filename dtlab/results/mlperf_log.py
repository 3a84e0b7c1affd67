"""A recorded run in MLPerf Training's log format, written with MLPerf's own library (mlperf_logging.mllog).

The store writes it beside result.json when it records an ok run (``mlperf.log``); ``bench.export --mlperf``
writes the same log for each run it lays out (dtlab.report.mlperf_export). Every time in it is the run's
own: init starts when rank 0's process started (result.json's ``timeline_unix``), the run starts when
training started, and the run stops ``time_total_s`` later (the trainer's timed span, the time the
report scores: an unbroken run's ``training_ended`` mark). The epochs in between take their train and
validation times, scaled so that the last ends at the run's stop (the checkpoints between them count
in the span). Integer milliseconds, as MLPerf logs them.

MLPerf's rules are not dtlab's: these runs are filed in the open division (another model, dataset and
quality target are allowed there) under the benchmark its checker knows that they are nearest to, BERT;
the target is the profile's ``target_accuracy`` (experiments/matrix.yml, read by dtlab.matrix), logged as
``target_accuracy``, and a run ends ``success`` when its final validation accuracy reaches it, ``aborted``
when it does not (the report's Table B.7: a run under the target counts as missed).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlperf_logging.mllog import constants as mlc
from mlperf_logging.mllog.mllog import MLLogger

from dtlab.cell import Cell
from trainer.config import IMDB_SPLIT_SIZE

FILENAME = "mlperf.log"  # beside result.json in the run's folder
ORG = "dtlab"
DIVISION = mlc.OPEN
BENCHMARK = mlc.BERT
SUBMISSION_STATUS = mlc.RESEARCH
USAGE = "training"
RULESET = "4.1.0"  # the training rules of the pinned mlperf-logging 4.1.x
TARGET_KEY = "target_accuracy"  # dtlab's own key: MLPerf's targets live in its checker's rules


def cell_group(cell: Cell) -> str:
    """The cell without its seed (ddp-g2-e20, ddp-g2-e20-fsdp): the runs MLPerf scores together."""
    return cell.key.replace(f"-e{cell.epochs}-s{cell.seed}", f"-e{cell.epochs}", 1)


def system_name(inventory: str | None, cell: Cell) -> str:
    """The MLPerf system of a run: the cluster and the cell's platform, count and epochs (lab-ddp-g2-e20)."""
    return f"{inventory or 'unknown'}-{cell_group(cell)}"


def reached_target(result: Mapping[str, Any], target_accuracy: float | None) -> bool:
    """The run's final accuracy reaches the target (every run does when there is none)."""
    return target_accuracy is None or float(result["final_accuracy"]) >= target_accuracy


def log_text(result: Mapping[str, Any], *, system: str, target_accuracy: float | None) -> str:
    """The run's MLPerf log (one ``:::MLLOG {...}`` line per event), written through mllog."""
    buffer = io.StringIO()
    logger = logging.Logger(f"dtlab.mlperf.{id(buffer)}", logging.INFO)  # not registered: no global state
    logger.addHandler(logging.StreamHandler(buffer))
    log = MLLogger(logger=logger, root_dir=str(Path(__file__).parents[2]))  # metadata: this file, line
    hyper = result["hyperparameters"]
    marks = result.get("timeline_unix") or {}
    run_start = round(float(marks.get("training_started") or _unix(result["started_at"])) * 1000)
    run_stop = run_start + round(float(result["time_total_s"]) * 1000)
    init_start = round(float(marks.get("process_started") or marks.get("core_entered") or 0) * 1000)
    init_start = init_start if 0 < init_start <= run_start else run_start
    epochs = result["epoch_metrics"]

    log.start(mlc.INIT_START, time_ms=init_start)
    for key, value in (
        (mlc.SUBMISSION_BENCHMARK, BENCHMARK),
        (mlc.SUBMISSION_ORG, ORG),
        (mlc.SUBMISSION_DIVISION, DIVISION),
        (mlc.SUBMISSION_STATUS, SUBMISSION_STATUS),
        (mlc.SUBMISSION_PLATFORM, system),
        (mlc.CACHE_CLEAR, False),  # dtlab drops no cache between runs
        (mlc.SEED, int(result["seed"])),
        (mlc.GLOBAL_BATCH_SIZE, int(hyper["batch_size_per_worker"]) * int(result["world_size"])),
        (mlc.TRAIN_SAMPLES, int(epochs[0]["train_samples"])),
        (mlc.EVAL_SAMPLES, _eval_samples(result)),
        (TARGET_KEY, target_accuracy),
    ):
        log.event(key, value, time_ms=init_start)
    log.end(mlc.INIT_STOP, time_ms=run_start)
    log.start(mlc.RUN_START, time_ms=run_start)
    spent = sum(float(m["train_time_s"]) + float(m["val_time_s"]) for m in epochs)
    scale = (run_stop - run_start) / spent if spent > 0 else 0.0
    begun = 0.0
    for metrics in epochs:
        epoch = {mlc.EPOCH_NUM: int(metrics["epoch"])}
        trained = begun + float(metrics["train_time_s"]) * scale
        ended = trained + float(metrics["val_time_s"]) * scale
        at = [min(run_stop, run_start + round(ms)) for ms in (begun, trained, ended)]
        log.start(mlc.EPOCH_START, metadata=epoch, time_ms=at[0])
        log.end(mlc.EPOCH_STOP, metadata=epoch, time_ms=at[1])
        log.start(mlc.EVAL_START, metadata=epoch, time_ms=at[1])
        log.event(mlc.EVAL_ACCURACY, float(metrics["val_accuracy"]), metadata=epoch, time_ms=at[2])
        log.end(mlc.EVAL_STOP, metadata=epoch, time_ms=at[2])
        begun = ended
    status = mlc.SUCCESS if reached_target(result, target_accuracy) else mlc.ABORTED
    log.end(mlc.RUN_STOP, metadata={mlc.STATUS: status}, time_ms=run_stop)
    return buffer.getvalue()


def _eval_samples(result: Mapping[str, Any]) -> int:
    """Reviews in the validation split: the generated test split's size, or IMDB's."""
    config = result.get("config") or {}
    if config.get("dataset") == "generated":
        return int(config["generated_test_size"])
    return IMDB_SPLIT_SIZE


def _unix(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()
