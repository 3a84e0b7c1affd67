"""Data: the IMDB source (real or generated), the tokenizer, the on-disk token cache and the batches.

Tokenized splits are cached once per (dataset fingerprint, tokenizer, max_length) under
cfg.token_cache_dir; workers that start together take a file lock, and the cache directory
appears by an atomic rename, so a reader never sees half a cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from trainer.config import GENERATED_DATA_VERSION, GENERATED_DATASET, ConfigError, TrainConfig, is_local_path

SPLITS = ("train", "test")
TOKEN_CACHE_VERSION = 1
# Reviews encoded per call: each Encoding keeps its tokens, offsets and truncated overflow until the call
# returns, about 50 KB a review at IMDB's length (55,000 in one call: 2.7 GB; 4,096 at a time: 0.3 GB).
ENCODE_CHUNK = 4096
CACHE_LOCK_TIMEOUT_S = 1800  # tokenizing 2x25k reviews at 512 tokens takes about a minute

# --- the generated IMDB-like dataset ------------------------------------------------

_POSITIVE = (  # noqa: SIM905 - a word list reads best as prose
    "great excellent wonderful brilliant superb amazing outstanding beautiful moving delightful "
    "masterpiece charming enjoyable fantastic gripping heartfelt hilarious impressive inspiring "
    "lovely memorable perfect powerful refreshing remarkable stunning terrific touching captivating "
    "clever engaging fun splendid marvelous riveting loved best favorite fascinating gorgeous solid"
).split()
_NEGATIVE = (  # noqa: SIM905 - a word list reads best as prose
    "awful terrible boring dull horrible bad worst poor weak dreadful mediocre pointless tedious "
    "annoying clumsy disappointing forgettable lame laughable mess painful predictable ridiculous "
    "shallow silly stupid tiresome unbearable uninspired wooden waste bland confusing cheap hated "
    "incoherent lifeless sloppy flat awkward overlong"
).split()
_NEUTRAL = (  # noqa: SIM905 - a word list reads best as prose
    "the a an and of to in is it that this was as with for on but his her he she they film movie "
    "story plot character characters scene scenes actor actors actress director script camera music "
    "time end ending beginning part one two first second some most more many all there about out "
    "what when who which where while after before then than just also even only still again here "
    "cast role roles screen dialogue audience series episode show television version original book "
    "world life man woman family friend friends house town city night day year years war police "
    "father mother son daughter brother sister wife husband girl boy kid kids group team people "
    "watch watched watching see saw seen look looks looked make made makes play played plays "
    "think thought know knew say said tell told go goes went come came take took give gave find "
    "found seem seems seemed feel felt try tried want wanted get got have has had do does did "
    "be been being are were would could should will can may might must not no yes very quite "
    "really rather pretty too so such way thing things something nothing everything anything "
    "lot bit kind sort point moment minutes hour hours half action drama comedy horror thriller "
    "romance documentary animation western music song songs voice effects budget production "
    "studio set sets location costume makeup sound editing pace length sequence shot shots "
    "opening final last next other another same different own old new young long short big "
    "small high low real true whole full early late later back home away around through over "
    "under into from by at up down off again ever never always often sometimes perhaps maybe"
).split()
_PUNCTUATION = (".", ",", "!", "?")


def generated_fingerprint(seed: int, train_size: int, test_size: int, median_words: int) -> str:
    key = f"generated-v{GENERATED_DATA_VERSION}|{seed}|{train_size}|{test_size}|{median_words}"
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def _generate_split(rng: np.random.Generator, size: int, median_words: int) -> tuple[list[str], np.ndarray]:
    """Reviews of long-tailed length: neutral filler with sentiment words that mostly match the label."""
    vocabulary = np.array(_NEUTRAL + list(_PUNCTUATION) + _POSITIVE + _NEGATIVE)
    neutral_count = len(_NEUTRAL) + len(_PUNCTUATION)
    # Zipf-like filler frequencies, with punctuation as common as short function words.
    filler_weights = 1.0 / np.arange(1, neutral_count + 1) ** 0.9
    filler_weights[len(_NEUTRAL):] = filler_weights[0] * np.array([0.6, 0.4, 0.05, 0.03])
    filler_weights /= filler_weights.sum()
    positive_ids = np.arange(neutral_count, neutral_count + len(_POSITIVE))
    negative_ids = np.arange(neutral_count + len(_POSITIVE), len(vocabulary))

    labels = rng.permutation(np.arange(size) % 2)  # balanced: half positive, half negative
    # Log-normal lengths like IMDB's (median ~230 words, long right tail), clipped to its range.
    lengths = np.clip(rng.lognormal(np.log(median_words), 0.75, size),
                      max(4, median_words // 20), median_words * 11).astype(int)
    sentiment_density, sentiment_purity, anchors = 0.08, 0.85, 2
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    review_of_word = np.repeat(np.arange(size), lengths)
    words = rng.choice(neutral_count, size=int(offsets[-1]), p=filler_weights)
    word_is_positive = labels[review_of_word] == 1
    # A sentiment word matches the review's label with probability `sentiment_purity`.
    slots = np.flatnonzero(rng.random(words.size) < sentiment_density)
    says_positive = word_is_positive[slots] == (rng.random(slots.size) < sentiment_purity)
    words[slots] = np.where(says_positive, rng.choice(positive_ids, slots.size),
                            rng.choice(negative_ids, slots.size))
    # Matching words early on, so truncation to a short max_length still leaves a signal.
    for _ in range(anchors):
        early = offsets[:-1] + rng.integers(0, np.minimum(lengths, 32))
        words[early] = np.where(labels == 1, rng.choice(positive_ids, size), rng.choice(negative_ids, size))
    vocabulary = vocabulary.tolist()
    texts = [" ".join([vocabulary[w] for w in words[offsets[i]:offsets[i + 1]].tolist()])
             for i in range(size)]
    return texts, labels.astype(np.int64)


def generate_imdb_like(seed: int, train_size: int = 25_000, test_size: int = 25_000,
                       median_words: int = 230):
    """A deterministic, balanced, IMDB-shaped DatasetDict {train, test} with columns text, label."""
    import datasets

    splits = {}
    for split_index, (name, size) in enumerate((("train", train_size), ("test", test_size))):
        rng = np.random.default_rng([seed, split_index])  # independent streams per split
        texts, labels = _generate_split(rng, size, median_words)
        splits[name] = datasets.Dataset.from_dict({"text": texts, "label": labels.tolist()})
    return datasets.DatasetDict(splits)


# --- the text source: real IMDB or generated ------------------------------------------

@dataclass
class TextSource:
    """Where the reviews come from; `fingerprint` identifies the content without loading it all."""

    cfg: TrainConfig
    fingerprint: str
    _loaded: object = None

    def load(self):
        if self._loaded is None:
            self._loaded = _load_dataset_dict(self.cfg)
        return self._loaded


def text_source(cfg: TrainConfig) -> TextSource:
    if cfg.dataset == GENERATED_DATASET:
        return TextSource(cfg, generated_fingerprint(cfg.generated_seed, cfg.generated_train_size,
                                                     cfg.generated_test_size, cfg.generated_median_words))
    loaded = _load_dataset_dict(cfg)
    fingerprint = hashlib.sha256("|".join(loaded[s]._fingerprint for s in SPLITS).encode()).hexdigest()[:20]
    return TextSource(cfg, fingerprint, loaded)


def _load_dataset_dict(cfg: TrainConfig):
    """IMDB from the hub (honours HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), a saved dataset, or a local path."""
    import datasets

    if cfg.dataset == GENERATED_DATASET:
        return generate_imdb_like(cfg.generated_seed, cfg.generated_train_size, cfg.generated_test_size,
                                  cfg.generated_median_words)
    path = Path(cfg.dataset).expanduser()
    try:
        if is_local_path(cfg.dataset) and (path / "dataset_dict.json").exists():
            loaded = datasets.load_from_disk(str(path))  # saved with DatasetDict.save_to_disk
        else:
            loaded = datasets.load_dataset(str(path) if path.exists() else cfg.dataset)
    except Exception as error:  # datasets raises many types; the user needs one line
        offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE")
        hint = "stage it locally and pass its path" if offline else "check the name or stage it locally"
        raise ConfigError(f"dataset: cannot load {cfg.dataset} ({type(error).__name__}: "
                          f"{str(error).splitlines()[0][:200]}); {hint}") from None
    missing = [s for s in SPLITS if s not in loaded]
    if missing or any(c not in loaded["train"].column_names for c in ("text", "label")):
        raise ConfigError(f"dataset: {cfg.dataset} needs splits train and test with columns text and label")
    return loaded


# --- tokenizer ------------------------------------------------------------------------

def generated_vocabulary() -> list[str]:
    """Every word and mark the generator writes, sorted: the generated tokenizer's whole vocabulary."""
    return sorted(set(_NEUTRAL + _POSITIVE + _NEGATIVE + list(_PUNCTUATION)))


def generated_tokenizer():
    """A BERT-style uncased WordPiece tokenizer over generated_vocabulary(), built, not trained.

    Training WordPiece on the texts gave different ids and merges from one process to the next (the
    trainer's hash-map order), so ranks and reruns could tokenize the same data differently. Built from
    the sorted word list, it is the same bytes in every process on every node.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] = 0, BERT's pad_token_id
    vocabulary = {token: index for index, token in enumerate([*specials, *generated_vocabulary()])}
    tokenizer = Tokenizer(models.WordPiece(vocab=vocabulary, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tokenizer


def load_tokenizer(cfg: TrainConfig):
    """A `tokenizers.Tokenizer`: the model's own, or the generated data's (built from its word list)."""
    from tokenizers import Tokenizer

    if cfg.model.startswith("generated:"):
        tokenizer = generated_tokenizer()
    else:
        from transformers import AutoTokenizer

        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(cfg.model, use_fast=True)
        except Exception as error:
            raise ConfigError(f"model: cannot load the tokenizer of {cfg.model} ({type(error).__name__}); "
                              "stage the model directory locally or check the hub id") from None
        if not getattr(hf_tokenizer, "is_fast", False):
            raise ConfigError(f"model: {cfg.model} has no fast tokenizer (tokenizer.json); add one")
        tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    _check_not_all_unknown(cfg, tokenizer)
    return tokenizer


def _check_not_all_unknown(cfg: TrainConfig, tokenizer) -> None:
    """Guard against tokenizers that load but map everything to [UNK] (a transformers 5 pitfall)."""
    unknown_id = tokenizer.token_to_id("[UNK]")
    ids = tokenizer.encode("the movie was great and the story was moving", add_special_tokens=False).ids
    if unknown_id is not None and ids and all(i == unknown_id for i in ids):
        raise ConfigError(f"model: the tokenizer of {cfg.model} maps every word to [UNK]; "
                          "its vocabulary did not load (provide tokenizer.json)")


def tokenizer_fingerprint(tokenizer) -> str:
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:20]


# --- the token cache ---------------------------------------------------------------------

class TokenizedSplit:
    """One split as a flat token array + offsets + labels: memory-mapped from the cache (from_cache),
    or handed over by a platform's own data path (trainer/platform_data.py)."""

    def __init__(self, fingerprint: str, ids: np.ndarray, offsets: np.ndarray, labels: np.ndarray):
        # The cache key: hash(dataset fingerprint, tokenizer bytes, max_length). Same key, same tokens.
        self.fingerprint = fingerprint
        self.ids, self.offsets, self.labels = ids, offsets, labels
        self.lengths = np.diff(self.offsets)

    @classmethod
    def from_cache(cls, directory: Path, split: str) -> TokenizedSplit:
        return cls(directory.name.removeprefix("tokens-"),
                   np.load(directory / f"{split}_ids.npy", mmap_mode="r"),
                   np.load(directory / f"{split}_offsets.npy"), np.load(directory / f"{split}_labels.npy"))

    def __len__(self) -> int:
        return len(self.labels)


def token_cache_key(dataset_fingerprint: str, tokenizer_hash: str, max_length: int) -> str:
    key = f"tokens-v{TOKEN_CACHE_VERSION}|{dataset_fingerprint}|{tokenizer_hash}|{max_length}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def tokens_fingerprint(cfg: TrainConfig, source: TextSource, tokenizer) -> str:
    """What the tokens of (dataset, tokenizer, max_length) are called, whichever path makes them."""
    return token_cache_key(source.fingerprint, tokenizer_fingerprint(tokenizer), cfg.max_length)


def tokenized_splits(cfg: TrainConfig, source: TextSource | None = None,
                     log=print) -> dict[str, TokenizedSplit]:
    """Both splits tokenized to cfg.max_length, from the cache or built into it once."""
    source = source or text_source(cfg)
    tokenizer = load_tokenizer(cfg)
    cache_dir = cfg.token_cache_dir
    final = cache_dir / f"tokens-{tokens_fingerprint(cfg, source, tokenizer)}"
    if not cfg.token_cache:  # a cold start: tokenized afresh, held in memory, nothing left behind
        cache_dir.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".uncached-", dir=cache_dir))
        try:
            log(f"tokenizing {cfg.dataset} to max_length {cfg.max_length} (token_cache false)")
            _build_token_cache(source, tokenizer, cfg.max_length, scratch / final.name)
            return {split: TokenizedSplit(final.name.removeprefix("tokens-"),
                                          *(np.load(scratch / final.name / f"{split}_{part}.npy")
                                            for part in ("ids", "offsets", "labels")))
                    for split in SPLITS}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if not (final / "meta.json").exists():
        with cache_lock(cache_dir, final.name):
            if not (final / "meta.json").exists():  # another worker may have built it while we waited
                log(f"tokenizing {cfg.dataset} to max_length {cfg.max_length} into {final}")
                _build_token_cache(source, tokenizer, cfg.max_length, final)
    return {split: TokenizedSplit.from_cache(final, split) for split in SPLITS}


def token_dtype(tokenizer) -> type:
    """The narrowest integer type that holds every id of the tokenizer (BERT's 30522: uint16)."""
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    return np.uint16 if vocab_size <= np.iinfo(np.uint16).max else np.int32


def _build_token_cache(source: TextSource, tokenizer, max_length: int, final: Path) -> None:
    tokenizer.enable_truncation(max_length)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    dtype = token_dtype(tokenizer)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        loaded = source.load()
        for split in SPLITS:
            texts, labels = loaded[split]["text"], loaded[split]["label"]
            lengths, chunks = np.zeros(len(texts), dtype=np.int64), []
            for start in range(0, len(texts), ENCODE_CHUNK):
                encodings = tokenizer.encode_batch(texts[start:start + ENCODE_CHUNK])
                lengths[start:start + len(encodings)] = [len(e.ids) for e in encodings]
                chunks.append(np.fromiter((i for e in encodings for i in e.ids), dtype=dtype))
            offsets = np.zeros(len(texts) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)
            np.save(staging / f"{split}_ids.npy", flat)
            np.save(staging / f"{split}_offsets.npy", offsets)
            np.save(staging / f"{split}_labels.npy", np.asarray(labels, dtype=np.int64))
        (staging / "meta.json").write_text(json.dumps(
            {"dataset_fingerprint": source.fingerprint, "max_length": max_length, "vocab_size": vocab_size}))
        os.rename(staging, final)  # atomic: readers see all of the cache or none of it
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        tokenizer.no_truncation()


def cache_lock(cache_dir: Path, name: str):
    cache_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(cache_dir / f".{name}.lock"), timeout=CACHE_LOCK_TIMEOUT_S)

    class _Bounded:
        def __enter__(self):
            try:
                lock.acquire()
            except Timeout:
                raise ConfigError(f"cache_dir: {lock.lock_file} held for over {CACHE_LOCK_TIMEOUT_S} s; "
                                  "remove it if no other trainer runs") from None

        def __exit__(self, *exc):
            lock.release()

    return _Bounded()
