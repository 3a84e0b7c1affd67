"""The ETL alone, side by side (issue #53): the trainer's own tokenizing (the DataLoader path with
token_cache false), Spark's (mapInPandas, the launcher's spark_etl) and Ray Data's (map_batches, the
launcher's ray_etl), on the same generated reviews, at each size, min/median/max over rounds.

    .venv/bin/python benchmarks/data_paths.py [--sizes 25000,250000] [--rounds 3] [--cpus 2]

A size is the reviews in the train split (IMDB's: 25k), with a test split of a tenth of it (IMDB's is as
large as its train split; a tenth keeps 3 rounds at 10x IMDB under an hour on 2 cores); every path cleans
and tokenizes both splits. All three start from the same Parquet parts (platform_data.staged_reviews, written
once per size, not timed) and end with the core's TokenizedSplits, token for token the same (checked each
round). Per path and round:
- ETL: the path's own job. The loader: read the parts, clean and tokenize in one process, as one training
  rank does (TOKENIZERS_PARALLELISM=false, as the lab runs it). Spark: read, mapInPandas, write Parquet,
  in a local[--cpus] application. Ray Data: read, map_batches, materialize, in a local Ray of --cpus CPUs.
- tokens ready: the ETL and one worker's read of its rows back into the core's splits (the loader: 0 more).
Spark's session and Ray are started once, before the rounds, with a warm-up ETL (not counted): their
start-up is each lab run's, in Table B.13, not the ETL's. The order of the paths rotates each round.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# As the lab runs them: one tokenizer thread a process; Spark's Python workers and Ray's workers import
# the trainer from the checkout.
os.environ.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", PYSPARK_PYTHON=sys.executable,
                  PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))

from benchmarks._trainer_common import machine, spread  # noqa: E402
from trainer import platform_data  # noqa: E402
from trainer.config import GENERATED_MAX_SPLIT_SIZE, PLATFORM_DATA_PATH, TrainConfig  # noqa: E402
from trainer.data import SPLITS, TextSource, text_source, tokenized_splits, tokens_fingerprint  # noqa: E402

PATHS = ("loader", "spark", "ray")
WARM_UP_SIZE = 200


def train_config(size: int, scratch: Path) -> TrainConfig:
    """The pipeline profile's trainer (generated bert-tiny, max_length 64) on `size` IMDB-length reviews
    for training and a tenth of that for validation."""
    return TrainConfig(model="generated:bert-tiny", dataset="generated", generated_train_size=size,
                       generated_test_size=max(2, size // 10), generated_median_words=230, max_length=64,
                       data_path=PLATFORM_DATA_PATH, token_cache=False, output_dir=str(scratch / "out"),
                       cache_dir=str(scratch / "token-cache"),
                       platform_data_dir=str(scratch / "platform-data")).validate()


def loader_etl(cfg: TrainConfig, directories: dict[str, Path]) -> tuple[dict, float]:
    """The DataLoader path's tokenizing (trainer.data.tokenized_splits, token_cache false), from the
    staged parts read into memory: (splits, seconds), the whole of it the ETL."""
    import datasets
    import pyarrow.parquet as pq

    started = time.perf_counter()
    loaded = datasets.DatasetDict({split: datasets.Dataset(pq.read_table(directories[split]))
                                   for split in SPLITS})
    source = TextSource(cfg, text_source(cfg).fingerprint, loaded)
    splits = tokenized_splits(cfg, source, log=lambda _: None)
    return splits, time.perf_counter() - started


def spark_etl(spark, cfg: TrainConfig, directories: dict[str, Path]) -> tuple[dict, float, float]:
    import pyarrow.parquet as pq

    from trainer.launchers._spark_etl import spark_etl as etl

    out_root = Path(cfg.platform_data_dir) / "etl-bench"
    shutil.rmtree(out_root, ignore_errors=True)
    try:
        started = time.perf_counter()
        written = etl(spark, cfg, directories, out_root)
        etl_s = time.perf_counter() - started
        splits = platform_data.splits_from_tables(
            cfg, {split: pq.read_table(written[split]) for split in SPLITS}, fingerprint(cfg))
        return splits, etl_s, time.perf_counter() - started
    finally:
        shutil.rmtree(out_root, ignore_errors=True)


def ray_etl(cfg: TrainConfig, directories: dict[str, Path]) -> tuple[dict, float, float]:
    from trainer.launchers import _ray_data

    started = time.perf_counter()
    datasets = _ray_data.ray_etl(cfg, directories)
    etl_s = time.perf_counter() - started
    splits = platform_data.splits_from_tables(
        cfg, {split: _ray_data.rows_table(datasets[split]) for split in SPLITS}, fingerprint(cfg))
    return splits, etl_s, time.perf_counter() - started


def fingerprint(cfg: TrainConfig) -> str:
    from trainer.data import load_tokenizer

    return tokens_fingerprint(cfg, text_source(cfg), load_tokenizer(cfg))


def same_tokens(splits: dict, reference: dict, path: str) -> None:
    import numpy as np

    for split in SPLITS:
        mine, theirs = splits[split], reference[split]
        if not (np.array_equal(mine.offsets, theirs.offsets) and np.array_equal(mine.ids, theirs.ids)
                and np.array_equal(mine.labels, theirs.labels) and mine.fingerprint == theirs.fingerprint):
            raise SystemExit(f"{path}: its {split} tokens differ from the DataLoader path's")


def ratio(values: list[float], reference: list[float]) -> str:
    """The ratio of the medians, and the range of the per-round ratios (rounds paired)."""
    per_round = [v / r for v, r in zip(values, reference, strict=True)]
    return (f"{statistics.median(values) / statistics.median(reference):5.2f} "
            f"[{min(per_round):.2f}-{max(per_round):.2f}]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="25000,250000", help="train reviews, comma-separated "
                        "(default 25000,250000: IMDB's size and 10x it)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every path at every size (default 3)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count(), help="Spark's local[N] and Ray's CPUs "
                        "(default: this machine's)")
    args = parser.parse_args()
    try:
        sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: give whole numbers, comma-separated")
    if any(not 2 <= size <= GENERATED_MAX_SPLIT_SIZE for size in sizes):
        parser.error(f"--sizes {args.sizes}: each must be between 2 and {GENERATED_MAX_SPLIT_SIZE}")
    if args.rounds < 1 or args.cpus < 1:
        parser.error("--rounds and --cpus need at least 1")

    print(f"{machine()}; {args.rounds} rounds; Spark local[{args.cpus}], Ray of {args.cpus} CPUs", flush=True)
    import ray
    import ray.data
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="dtlab-data-paths-") as scratch_dir:
        scratch = Path(scratch_dir)
        spark = (SparkSession.builder.master(f"local[{args.cpus}]").appName("dtlab-data-paths-bench")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", "4g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # its progress lines, every execution
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            warm = train_config(WARM_UP_SIZE, scratch / "warm-up")
            warm_dirs = platform_data.staged_reviews(warm)
            spark_etl(spark, warm, warm_dirs), ray_etl(warm, warm_dirs)
            results = {size: measure(spark, train_config(size, scratch / str(size)), args.rounds)
                       for size in sizes}
        finally:
            ray.shutdown()
            spark.stop()

    for size, figures in results.items():
        print(f"\n{size} train + {max(2, size // 10)} test reviews; seconds, median [min-max] over "
              f"{args.rounds} rounds; ratio to the loader: of the medians [per-round range]")
        print(f"{'path':<8}{'ETL':>24}{'tokens ready':>24}{'ETL / loader':>20}{'ready / loader':>20}")
        loader = figures["loader"]
        for path in PATHS:
            etl_s, ready_s = figures[path]
            print(f"{path:<8}{spread(etl_s):>24}{spread(ready_s):>24}{ratio(etl_s, loader[0]):>20}"
                  f"{ratio(ready_s, loader[1]):>20}")
    return 0


def measure(spark, cfg: TrainConfig, rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    """Every path `rounds` times on cfg's reviews: {path: (ETL seconds, tokens-ready seconds)}."""
    started = time.perf_counter()
    directories = platform_data.staged_reviews(cfg)
    staged_s = time.perf_counter() - started
    print(f"{cfg.generated_train_size} + {cfg.generated_test_size} reviews staged in {staged_s:.0f} s",
          flush=True)
    figures: dict[str, tuple[list[float], list[float]]] = {path: ([], []) for path in PATHS}
    for round_index in range(rounds):
        order = PATHS[round_index % len(PATHS):] + PATHS[:round_index % len(PATHS)]
        splits = {}
        for path in order:
            if path == "loader":
                splits[path], etl_s = loader_etl(cfg, directories)
                ready_s = etl_s
            elif path == "spark":
                splits[path], etl_s, ready_s = spark_etl(spark, cfg, directories)
            else:
                splits[path], etl_s, ready_s = ray_etl(cfg, directories)
            figures[path][0].append(etl_s)
            figures[path][1].append(ready_s)
        for path in ("spark", "ray"):
            same_tokens(splits[path], splits["loader"], path)
        print(f"round {round_index + 1}: " + ", ".join(f"{path} {figures[path][0][-1]:.1f} s"
                                                      for path in PATHS), flush=True)
    return figures


if __name__ == "__main__":
    sys.exit(main())
