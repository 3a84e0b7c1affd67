"""Data: the generated IMDB-like set, the WordPiece tokenizer, the token cache and the batch order."""

import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from trainer import data
from trainer.batches import LengthGroupedBatchSampler, PaddedBatches, validation_batches
from trainer.config import TrainConfig
from trainer.data import generate_imdb_like, load_tokenizer, tokenized_splits


def test_generated_data_is_deterministic_balanced_and_imdb_shaped():
    first = generate_imdb_like(seed=7, train_size=2000, test_size=400)
    again = generate_imdb_like(seed=7, train_size=2000, test_size=400)
    other_seed = generate_imdb_like(seed=8, train_size=2000, test_size=400)
    assert first["train"]["text"] == again["train"]["text"]
    assert first["train"]["text"] != other_seed["train"]["text"]
    assert (first.num_rows["train"], first.num_rows["test"]) == (2000, 400)
    assert sum(first["train"]["label"]) == 1000  # balanced
    words = np.array([len(text.split()) for text in first["train"]["text"]])
    assert 200 <= np.median(words) <= 260  # IMDB: ~230 words median
    assert np.mean(words) > np.median(words) * 1.15  # long right tail, like IMDB's
    assert words.max() > 4 * np.median(words)


def test_generated_data_scales_down():
    short = generate_imdb_like(seed=7, train_size=100, test_size=10, median_words=40)
    assert 30 <= np.median([len(text.split()) for text in short["train"]["text"]]) <= 50


def test_wordpiece_tokenizer_knows_the_words(make_config):
    cfg = make_config()
    tokenizer = load_tokenizer(cfg)
    encoding = tokenizer.encode("the movie was great but the plot was dull")
    unknown = tokenizer.token_to_id("[UNK]")
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
    assert unknown not in encoding.ids
    assert tokenizer.token_to_id("[PAD]") == 0  # BERT's pad_token_id


@pytest.mark.slow
def test_generated_tokenizer_is_the_same_bytes_in_every_process(make_config):
    # Trained WordPiece differed between processes (hash-map order); ranks on different nodes and reruns
    # must tokenize alike, so the generated tokenizer is built from the generator's sorted word list.
    cfg = make_config()
    here = load_tokenizer(cfg).to_str()
    code = "from trainer.data import generated_tokenizer; print(generated_tokenizer().to_str())"
    for hash_seed in ("1", "2"):
        environment = {**os.environ, "PYTHONHASHSEED": hash_seed}
        elsewhere = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   env=environment, timeout=120).stdout.strip()
        assert elsewhere == here
    reviews = generate_imdb_like(seed=3, train_size=50, test_size=2)["train"]["text"]
    tokenizer = load_tokenizer(cfg)
    assert all(tokenizer.token_to_id("[UNK]") not in tokenizer.encode(text).ids for text in reviews)


def test_token_cache_is_built_once_and_reused(make_config, tmp_path):
    cfg = make_config(cache_dir=str(tmp_path / "cache"))
    built = []
    first = tokenized_splits(cfg, log=built.append)
    second = tokenized_splits(cfg, log=built.append)
    assert len(built) == 1
    assert np.array_equal(first["train"].ids, second["train"].ids)
    assert first["train"].lengths.max() <= cfg.max_length
    tokenized_splits(make_config(cache_dir=str(tmp_path / "cache"), max_length=32), log=built.append)
    assert len(built) == 2  # max_length is part of the key
    assert len(list((tmp_path / "cache").glob("tokens-*"))) == 2


def test_tokens_encoded_in_chunks_are_those_of_one_call(make_config, monkeypatch):
    """The token cache encodes a few thousand reviews a call (memory: trainer/data.py's ENCODE_CHUNK): 7 at a
    time, over a split that is no multiple of 7, gives the very arrays one call gives."""
    cfg = make_config(token_cache=False, generated_train_size=150)
    monkeypatch.setattr(data, "ENCODE_CHUNK", 10**9)
    whole = tokenized_splits(cfg, log=lambda _: None)
    monkeypatch.setattr(data, "ENCODE_CHUNK", 7)
    chunked = tokenized_splits(cfg, log=lambda _: None)
    for split in ("train", "test"):
        assert len(chunked[split]) % 7 != 0 and len(chunked[split]) == len(whole[split])
        for part in ("ids", "offsets", "labels"):
            assert np.array_equal(getattr(chunked[split], part), getattr(whole[split], part)), (split, part)
        assert chunked[split].ids.dtype == whole[split].ids.dtype


def _tokenize_in_child(cfg_values: dict) -> tuple[int, int]:
    built = []
    splits = tokenized_splits(TrainConfig(**cfg_values), log=built.append)
    return len(built), int(np.asarray(splits["train"].ids, dtype=np.int64).sum())


@pytest.mark.slow
def test_token_cache_is_safe_for_workers_starting_together(make_config, tmp_path):
    cfg = make_config(cache_dir=str(tmp_path / "cache"), generated_train_size=2000)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        outcomes = pool.map(_tokenize_in_child, [cfg.as_dict()] * 2, chunksize=1)
    assert sum(builds for builds, _ in outcomes) == 1  # one built it, the others waited and read it
    assert len({checksum for _, checksum in outcomes}) == 1
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir() and p.name.startswith(".")]
    assert leftovers == []


def test_length_grouped_batches_keep_the_samplers_split():
    lengths = np.random.default_rng(0).integers(5, 500, size=1000)
    epochs = {}
    for rank in (0, 1):
        sampler = torch.utils.data.DistributedSampler(range(1000), num_replicas=2, rank=rank, seed=3)
        batches = LengthGroupedBatchSampler(sampler, lengths, batch_size=16, seed=3, group_batches=8)
        batches.set_epoch(1)
        epochs[rank] = list(batches)
        assert sorted(i for batch in epochs[rank] for i in batch) == sorted(sampler)  # same share
        assert epochs[rank] == list(batches)  # deterministic
        assert len(epochs[rank]) == len(batches)
    assert not set(sum(epochs[0], [])) & set(sum(epochs[1], []))
    padding = sum(len(b) * lengths[b].max() - lengths[b].sum() for b in epochs[0])
    plain = [list(sampler)[i:i + 16] for i in range(0, 500, 16)]
    plain_padding = sum(len(b) * lengths[b].max() - lengths[b].sum() for b in plain)
    assert padding < plain_padding / 4  # grouping by length is what removes the padding


def test_ranks_step_with_batches_of_similar_length():
    # IMDB-like token counts; a step lasts as long as the longest batch of any rank.
    lengths = np.minimum(np.random.default_rng(0).lognormal(np.log(230), 0.75, 4000).astype(int) + 2, 512)
    widths = {}
    for rank in (0, 1):
        sampler = torch.utils.data.DistributedSampler(range(4000), num_replicas=2, rank=rank, seed=3)
        batches = LengthGroupedBatchSampler(sampler, lengths, batch_size=32, seed=3)
        batches.set_epoch(0)
        widths[rank] = np.array([lengths[batch].max() for batch in batches])
    busy = (widths[0] + widths[1]).sum() / 2
    assert busy / np.maximum(widths[0], widths[1]).sum() >= 0.95  # little waiting for the other rank
    assert busy < 0.6 * 512 * len(widths[0])  # and far less padding than batches of mixed lengths


def test_validation_shards_cover_the_test_split_once():
    lengths = np.arange(101)
    shards = [validation_batches(lengths, rank, 2, batch_size=8) for rank in (0, 1)]
    seen = sorted(i for shard in shards for batch in shard for i in batch)
    assert seen == list(range(101))


def test_batches_are_padded_to_their_longest_member(make_config):
    splits = tokenized_splits(make_config())
    batch = PaddedBatches(splits["train"])[[0, 1, 2]]
    width = int(splits["train"].lengths[[0, 1, 2]].max())
    assert batch["input_ids"].shape == (3, width)
    assert batch["attention_mask"].sum().item() == int(splits["train"].lengths[[0, 1, 2]].sum())
    assert batch["labels"].tolist() == splits["train"].labels[[0, 1, 2]].tolist()


def test_the_tokens_module_imports_no_torch():
    """A platform's ETL tasks tokenize with trainer.data and trainer.platform_data: torch's import (2-9 s
    per Spark Python worker or Ray Data task on the lab) would count in the ETL's time."""
    import subprocess
    import sys

    check = "import sys, trainer.data, trainer.platform_data; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip() == "False"

