"""Ray's own data path (data_path: platform, trainer/platform_data.py): Ray Data's ETL into Ray Train.

On the driver, before the workers start: the staged reviews read as Ray Data's Parquet datasets, cleaned
and tokenized in Ray Data's tasks on the cluster's nodes, materialized in the object store (the ETL's
time one figure, etl_started to etl_ended). TorchTrainer then hands each worker every row of both splits
(a DataConfig that splits none: the core's DistributedSampler takes each rank's share, as under ddp), and
the workers' hooks turn the rows back into the core's TokenizedSplits.

CPUs: materialize() ends before TorchTrainer reserves its workers' CPUs, so the ETL's tasks may use every
CPU of the cluster, and the workers' reading of the materialized blocks runs no task at all (nothing
waits for a CPU that training holds). Every wait is bounded: the driver's for a free CPU, and each Ray
Data execution's (ETL and workers' reading) by Ray Data's no-progress guard.
"""

from __future__ import annotations

import time

import ray
import ray.data
import ray.train
from ray.data.exceptions import ExecutionTimeoutError

from trainer import platform_data
from trainer.config import PLATFORM_DATA_PATH, TrainConfig
from trainer.hooks import PlatformRowsHooks

# How long a Ray Data execution may move no block before it fails (Ray's default: 30 minutes), and the
# driver may wait for a free CPU: one ETL task tokenizes its reviews in seconds.
NO_PROGRESS_TIMEOUT_S = 300


def etl(cfg: TrainConfig, prog: str) -> tuple[platform_data.EtlRun | None, dict]:
    """On the driver: (the run's record, TorchTrainer's datasets and dataset_config), the datasets each
    split's materialized rows for every worker; (None, {}) for data_path loader."""
    if cfg.data_path != PLATFORM_DATA_PATH:
        return None, {}
    run, directories = platform_data.etl_run(cfg)
    try:
        _wait_for_a_free_cpu()
        with platform_data.timed(run.marks, "etl"):
            datasets = ray_etl(cfg, directories)
    except ExecutionTimeoutError:
        raise SystemExit(f"{prog}: error: Ray Data's ETL made no progress for {NO_PROGRESS_TIMEOUT_S} s "
                         "(no CPU of the cluster free for its tasks?)") from None
    return run, {"datasets": datasets, "dataset_config": ray.train.DataConfig(datasets_to_split=[])}


def _wait_for_a_free_cpu() -> None:
    """Until a CPU of the cluster is free (Parquet's sampling on the driver waits for one with no limit):
    a previous run's workers may still be letting theirs go."""
    deadline = time.monotonic() + NO_PROGRESS_TIMEOUT_S
    while ray.available_resources().get("CPU", 0) < 1:
        if time.monotonic() > deadline:
            raise ExecutionTimeoutError(f"no CPU of the cluster was free for {NO_PROGRESS_TIMEOUT_S} s")
        time.sleep(1)


def ray_etl(cfg: TrainConfig, directories: dict) -> dict[str, ray.data.MaterializedDataset]:
    """Each split's staged Parquet parts read, cleaned and tokenized in Ray Data's tasks (rows of
    platform_data.TOKEN_COLUMNS, in any order), materialized in the object store."""
    context = ray.data.DataContext.get_current()  # TorchTrainer hands the driver's to its workers
    context.execution_no_progress_timeout_s = NO_PROGRESS_TIMEOUT_S
    # Ray Data's first Parquet reader: the second (Ray 2.60's default) reads the parts' footers in a pool
    # of 32 actors, a worker process each, at every read (30 s and gigabytes on the lab's 1-CPU nodes),
    # and packs small parts into one read task (one node tokenizing them all).
    context.use_datasource_v2 = False
    return {split: ray.data.read_parquet(str(directory)).map_batches(
                platform_data.tokenize_frame, fn_kwargs={"cfg": cfg}, batch_format="pandas").materialize()
            for split, directory in directories.items()}


def rows_table(rows):
    """A Dataset's or a DataIterator's rows as one pyarrow Table, streamed block by block."""
    import pyarrow as pa

    batches = list(rows.iter_batches(batch_format="pyarrow", batch_size=None))
    if not batches:
        raise RuntimeError("Ray Data's ETL handed over no rows")
    return pa.concat_tables(batches)


class RayDataHooks(PlatformRowsHooks):
    """The Ray launcher's hooks' data part: with data_path platform, the rows Ray Train hands this worker
    (the driver's `etl`) as the core's splits; with loader, the trainer's own tokens."""

    def platform_rows(self, split: str):
        return rows_table(ray.train.get_dataset_shard(split))
