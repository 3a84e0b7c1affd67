"""The platform data path's shared pieces (trainer/platform_data.py), without a platform: the staged
reviews, the cleaning and tokenizing step both platforms run, and the way back to the core's splits."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer import data
from trainer import platform_data as pdata
from trainer.config import ConfigError
from trainer.options import from_dict

SMALL = dict(model="generated:bert-tiny", dataset="generated", generated_train_size=300,
             generated_test_size=40, generated_median_words=40, max_length=32)


def config(tmp_path, **overrides):
    return from_dict({**SMALL, "output_dir": str(tmp_path / "out"), "cache_dir": str(tmp_path / "cache"),
                      "platform_data_dir": str(tmp_path / "shared"), "data_path": "platform", **overrides})


def platform_splits(cfg, shuffle_seed=0):
    """What a platform does, in one process: each staged part tokenized, the rows handed over shuffled."""
    run, directories = pdata.etl_run(cfg)
    tables = {}
    for split, directory in directories.items():
        parts = [pdata.tokenize_frame(pq.read_table(part).to_pandas(), cfg)
                 for part in sorted(directory.glob("*.parquet"))]
        rows = pa.concat_tables([pa.Table.from_pandas(p, preserve_index=False) for p in parts])
        tables[split] = rows.take(np.random.default_rng(shuffle_seed).permutation(len(rows)))
    return pdata.splits_from_tables(cfg, tables, run.tokens_fingerprint)


def test_the_platform_steps_give_the_loaders_tokens_whatever_order_the_rows_come_back_in(tmp_path):
    cfg = config(tmp_path)
    loader = data.tokenized_splits(cfg)
    platform = platform_splits(cfg)
    for split in data.SPLITS:
        assert platform[split].fingerprint == loader[split].fingerprint
        assert np.array_equal(platform[split].offsets, loader[split].offsets)
        assert np.array_equal(platform[split].ids, loader[split].ids)
        assert platform[split].ids.dtype == loader[split].ids.dtype
        assert np.array_equal(platform[split].labels, loader[split].labels)


def test_cleaning_is_the_tokenizers_own_normalisation(tmp_path):
    """Accents, capitals, control characters and IMDB's <br /> tags: cleaning first, then tokenizing
    without the normalizer, gives the ids of tokenizing the raw text."""
    cfg = config(tmp_path)
    texts = ["The FILM was Great<br /><br />and moving", "Café crème, awful\tplot\x00!", "  spaced   out  "]
    tokenizer = data.load_tokenizer(cfg)
    tokenizer.enable_truncation(cfg.max_length)
    import pandas as pd

    frame = pd.DataFrame({"index": [0, 1, 2], "text": texts, "label": [1, 0, 1]})
    expected = [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    assert pdata.tokenize_frame(frame, cfg)["input_ids"].tolist() == expected
    assert pdata.clean_texts(["Café"], cfg) == ["cafe"]


def test_reviews_are_staged_once_as_parquet_parts(tmp_path):
    cfg = config(tmp_path)
    directories = pdata.staged_reviews(cfg)
    parts = sorted(directories["train"].glob("*.parquet"))
    assert len(parts) == pdata.REVIEW_PARTS
    assert sum(pq.read_metadata(p).num_rows for p in parts) == cfg.generated_train_size
    stamp = parts[0].stat().st_mtime_ns
    assert pdata.staged_reviews(cfg) == directories
    assert parts[0].stat().st_mtime_ns == stamp  # not written again


def test_rows_lost_on_the_way_are_refused(tmp_path):
    cfg = config(tmp_path)
    run, directories = pdata.etl_run(cfg)
    tables = {split: pa.Table.from_pandas(pdata.tokenize_frame(pq.read_table(d).to_pandas(), cfg),
                                          preserve_index=False) for split, d in directories.items()}
    tables["train"] = tables["train"].slice(1)
    with pytest.raises(RuntimeError, match="not each review once"):
        pdata.splits_from_tables(cfg, tables, run.tokens_fingerprint)


def test_the_platform_path_needs_a_directory_every_node_sees(tmp_path):
    with pytest.raises(ConfigError, match="^platform_data_dir: data_path platform reads"):
        config(tmp_path, platform_data_dir=None).validate()


def test_a_launcher_without_a_platform_path_refuses_it_in_one_line(tmp_path):
    from trainer.core import train

    with pytest.raises(ConfigError, match=r"^data_path: platform is Spark's and Ray's own ETL; "
                                          r"ddp \(torchrun\) reads through the DataLoader: use loader$"):
        train(config(tmp_path))


def test_token_cache_false_tokenizes_afresh_and_leaves_nothing(tmp_path):
    cached = data.tokenized_splits(config(tmp_path, data_path="loader"))
    cold = config(tmp_path, data_path="loader", token_cache=False, cache_dir=str(tmp_path / "cold"))
    splits = data.tokenized_splits(cold)
    assert np.array_equal(splits["train"].ids, cached["train"].ids)
    assert splits["train"].fingerprint == cached["train"].fingerprint
    assert not any(p.name.startswith("tokens-") for p in (tmp_path / "cold").iterdir())
