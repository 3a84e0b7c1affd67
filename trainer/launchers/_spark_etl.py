"""data_path platform under Spark (issue #53, the notes' scenario B), in the run's one application or
Connect session: its executors read the staged reviews, clean and tokenize them in partitions
(mapInPandas) and write the rows as Parquet to a directory every node sees; TorchDistributor's training
processes then read those rows there. Imports neither pyspark nor torch on import: the driver's loader
path starts as fast as before, and the training processes unpickle train_on_executor as before."""

import contextlib
import shutil
import uuid
from pathlib import Path

from trainer import platform_data
from trainer.config import PLATFORM_DATA_PATH

REVIEW_SCHEMA = "index bigint, text string, label bigint"  # platform_data.staged_reviews' parts
TOKEN_SCHEMA = "index bigint, input_ids array<int>, label bigint"  # platform_data.TOKEN_COLUMNS


@contextlib.contextmanager
def platform_etl(spark, cfg):
    """What the training function gets beside cfg: None on the loader path; on the platform path
    (EtlRun, {split: directory of its rows}), the directories removed when the run ends (the staged
    reviews are kept for the next run)."""
    if cfg.data_path != PLATFORM_DATA_PATH:
        yield None
        return
    run, directories = platform_data.etl_run(cfg)
    out_root = Path(cfg.platform_data_dir).resolve() / f"etl-{uuid.uuid4().hex}"
    try:
        with platform_data.timed(run.marks, "etl"):
            written = spark_etl(spark, cfg, directories, out_root)
        yield run, {split: str(directory) for split, directory in written.items()}
    finally:
        shutil.rmtree(out_root, ignore_errors=True)


def spark_etl(spark, cfg, directories: dict[str, Path], out_root: Path) -> dict[str, Path]:
    """Each split's staged reviews read, cleaned and tokenized on the executors and written under
    out_root as Parquet rows of TOKEN_SCHEMA, through Spark's reader and writer: {split: directory}."""
    written = {}
    for split, directory in directories.items():
        written[split] = Path(out_root).resolve() / split
        # The schema given, no Spark job reads a part's footer for it; file://, not the default file system
        reviews = spark.read.schema(REVIEW_SCHEMA).parquet(f"file://{Path(directory).resolve()}")
        rows = reviews.mapInPandas(_tokenize_partition(cfg), TOKEN_SCHEMA)
        rows.write.parquet(f"file://{written[split]}")
    return written


def _tokenize_partition(cfg):
    """mapInPandas's function; cfg travels inside it (cloudpickle, also through Spark Connect)."""

    def tokenize_partition(frames):
        from trainer.platform_data import tokenize_frame  # on the executor

        for frame in frames:
            yield tokenize_frame(frame, cfg)

    return tokenize_partition


def etl_hooks(run, written: dict[str, str]):
    """A training process's hooks on the platform path: its tokens are the rows the ETL wrote."""
    from trainer.hooks import PlatformRowsHooks  # here: the driver, importing this module, loads no torch

    class SparkRows(PlatformRowsHooks):
        def platform_rows(self, split: str):
            import pyarrow.parquet as pq

            return pq.read_table(written[split])

    return SparkRows(run)
