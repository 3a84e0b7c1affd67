"""A platform's own data path (data_path: platform): Spark's or Ray's ETL in place of the trainer's.

The pipeline the architecture notes recommend for scenario B, in the platform's own APIs:
1. the raw reviews, staged once as Parquet parts where every node reads them (`staged_reviews`: the
   IMDB files or the generated ones, under platform_data_dir: a shared disk, the HDFS-less cluster's
   equivalent);
2. the platform reads them in partitions, cleans them with the trainer's normalisation and tokenizes
   them with the trainer's tokenizer (`tokenize_frame`: the same code under Spark's mapInPandas and Ray
   Data's map_batches);
3. it hands the rows (index, input_ids, label) to the training workers (Spark: Parquet written to the
   shared disk; Ray: the object store, through get_dataset_shard);
4. `splits_from_tables` turns them back into the TokenizedSplit the core trains on, in the dataset's
   order: token for token what the DataLoader path's cache holds.

Every rank takes every row and the core's DistributedSampler takes its share, as under ddp: the sampler
reshuffles the whole split across ranks each epoch, and a fixed shard per rank would train other batches
(other per-epoch numbers). The rows cross the network once per rank; at 25k reviews of 512 tokens that
is 26 MB of ids a split.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainer.config import TrainConfig
from trainer.data import (
    SPLITS,
    TokenizedSplit,
    cache_lock,
    load_tokenizer,
    text_source,
    token_dtype,
    tokens_fingerprint,
)

REVIEW_PARTS = 8  # Parquet parts a split is staged in: the partitions the platform's first stage reads
TOKEN_COLUMNS = ("index", "input_ids", "label")


@dataclass
class EtlRun:
    """What the driver's ETL hands the training workers beside the rows: the tokens' name (the
    DataLoader path's cache key for the same data) and its wall-clock marks (etl_started, etl_ended)."""

    tokens_fingerprint: str
    marks: dict[str, float] = field(default_factory=dict)


def etl_run(cfg: TrainConfig) -> tuple[EtlRun, dict[str, Path]]:
    """On the driver, before the ETL: the raw reviews staged (once per dataset) and the run's record.
    (TrainConfig.validate has refused data_path platform without a platform_data_dir.)"""
    source = text_source(cfg)
    tokenizer = load_tokenizer(cfg)
    return EtlRun(tokens_fingerprint(cfg, source, tokenizer)), staged_reviews(cfg, source)


def staged_reviews(cfg: TrainConfig, source=None) -> dict[str, Path]:
    """Each split's directory of Parquet parts (index, text, label) under platform_data_dir, written once
    per dataset: a lock and an atomic rename, so concurrent runs and half-written parts are never read."""
    source = source or text_source(cfg)
    root = Path(cfg.platform_data_dir)
    final = root / f"reviews-{source.fingerprint}"
    if not (final / "done").exists():
        with cache_lock(root, final.name):
            if not (final / "done").exists():
                _stage(source, final)
    return {split: final / split for split in SPLITS}


def _stage(source, final: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        loaded = source.load()
        for split in SPLITS:
            texts, labels = loaded[split]["text"], loaded[split]["label"]
            table = pa.table({"index": pa.array(np.arange(len(texts)), pa.int64()), "text": texts,
                              "label": pa.array(labels, pa.int64())})
            (staging / split).mkdir()
            bounds = np.linspace(0, len(texts), REVIEW_PARTS + 1).astype(int)
            for part, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                pq.write_table(table.slice(start, end - start), staging / split / f"part-{part:05d}.parquet")
        (staging / "done").touch()
        shutil.rmtree(final, ignore_errors=True)  # a copy from before "done" existed
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# --- clean and tokenize: one partition, under either platform ---------------------------------------

_TOKENIZERS: dict[tuple[str, int], tuple[object, object]] = {}


def _etl_tokenizers(cfg: TrainConfig):
    """(normalizer, tokenizer without it, truncating to max_length), once per process: the cleaning step
    is the tokenizer's own normalisation, so cleaning then tokenizing gives the DataLoader path's ids."""
    key = (cfg.model, cfg.max_length)
    if key not in _TOKENIZERS:
        tokenizer = load_tokenizer(cfg)
        normalizer = tokenizer.normalizer
        from tokenizers import normalizers

        tokenizer.normalizer = normalizers.Sequence([])  # already cleaned
        tokenizer.enable_truncation(cfg.max_length)
        _TOKENIZERS[key] = (normalizer, tokenizer)
    return _TOKENIZERS[key]


def clean_texts(texts, cfg: TrainConfig) -> list[str]:
    """The trainer's normalisation (its tokenizer's normalizer: BERT's lower-casing, accents, control
    characters), as the ETL's cleaning step."""
    normalizer, _ = _etl_tokenizers(cfg)
    return [normalizer.normalize_str(text) for text in texts] if normalizer else list(texts)


def tokenize_frame(frame, cfg: TrainConfig):
    """A pandas frame of (index, text, label) cleaned and tokenized: (index, input_ids, label)."""
    import pandas as pd

    _, tokenizer = _etl_tokenizers(cfg)
    encodings = tokenizer.encode_batch(clean_texts(frame["text"].tolist(), cfg))
    return pd.DataFrame({"index": frame["index"].to_numpy(), "input_ids": [e.ids for e in encodings],
                         "label": frame["label"].to_numpy()})


# --- back to the core's splits ---------------------------------------------------------------------

def splits_from_tables(cfg: TrainConfig, tables: dict, fingerprint: str) -> dict[str, TokenizedSplit]:
    """Each split's rows (a pyarrow Table of TOKEN_COLUMNS, in any order) as a TokenizedSplit in the
    dataset's order. Refuses rows lost or repeated on the way."""
    import pyarrow.compute as pc

    dtype = token_dtype(load_tokenizer(cfg))
    splits = {}
    for split in SPLITS:
        table = tables[split].select(list(TOKEN_COLUMNS)).sort_by("index")
        index = table.column("index").to_numpy()
        if not np.array_equal(index, np.arange(len(index))):
            raise RuntimeError(f"the platform's ETL handed over {len(index)} {split} rows that are not "
                               "each review once")
        ids = table.column("input_ids")
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(pc.list_value_length(ids).to_numpy(zero_copy_only=False), out=offsets[1:])
        flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(dtype)
        labels = table.column("label").to_numpy().astype(np.int64)
        splits[split] = TokenizedSplit(fingerprint, flat, offsets, labels)
    return splits


@contextlib.contextmanager
def timed(marks: dict[str, float], name: str):
    """Records <name>_started and <name>_ended (time.time) in `marks` around the block."""
    marks[f"{name}_started"] = time.time()
    yield
    marks[f"{name}_ended"] = time.time()
