"""TrainConfig: every knob of a training run, settable from a YAML file and from CLI flags.

    python -m trainer.launchers.torchrun --config experiments/trainer/smoke.yml --epochs 2

Flags override the YAML file, which overrides the defaults below (the study's protocol).
Bad values raise ConfigError with one line that names the key and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tempfile
import typing
from pathlib import Path

import jsonschema

from trainer import strategies
from trainer.schema import first_error

GENERATED_MODEL_PREFIX = "generated:"
# "generated:<name>": a randomly initialised BERT of the published miniature sizes (Turc et al., 2019;
# the hub ids prajjwal1/bert-tiny, -mini, -small and -medium on a cluster that reaches the hub), built from
# these shapes alone: nothing downloaded. Sharding strategies pay off only on the larger ones (#31).
GENERATED_MODEL_SHAPES = {
    name: dict(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
               intermediate_size=4 * hidden, max_position_embeddings=512)
    for name, layers, hidden, heads in (("bert-tiny", 2, 128, 2), ("bert-mini", 4, 256, 4),
                                        ("bert-small", 4, 512, 8), ("bert-medium", 8, 512, 8))
}
# The published miniatures' hub ids have the same shapes (their config.json), so the harness checks a
# strategy's split of them before a matrix starts without downloading anything.
PUBLISHED_MODEL_SHAPES = {f"prajjwal1/{name}": shape for name, shape in GENERATED_MODEL_SHAPES.items()}
GENERATED_DATASET = "generated"
IMDB_SPLIT_SIZE = 25_000  # reviews in each of IMDB's two splits
# Generated splits up to 10x IMDB's and more: the platforms' ETL is measured at IMDB's size and at
# 10x it (benchmarks/data_paths.py, issue #53).
GENERATED_MAX_SPLIT_SIZE = 20 * IMDB_SPLIT_SIZE
# Bump when the generator's output, or the generated tokenizer, changes: both enter the token cache key
# and the harness's cell hash, so results and caches made with the old ones are never taken for new.
GENERATED_DATA_VERSION = 1
GENERATED_TOKENIZER_VERSION = 2  # 1: WordPiece trained per process; 2: built from the sorted word list
COMPILE_MODES = ("no", "default", "reduce-overhead")
OPTIMIZERS = ("adamw", "sgd")  # sgd exists only for the DDP-equivalence test: Adam hides gradient scale
DEVICES = ("auto", "cpu", "cuda")
MIXED_PRECISIONS = ("auto", "no", "bf16", "fp16")
# Gradient compression on the all-reduce (DDP communication hooks; Horovod: fp16 alone)
GRAD_COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
DATA_PATHS = ("loader", "platform")  # the DataLoader's own tokens, or the platform's ETL's
DEFAULT_DATA_PATH, PLATFORM_DATA_PATH = DATA_PATHS
PREDICT_PATH = "/predict"  # the path both servers (trainer.serving) answer, and the harness calls
PIPELINE_SCHEDULES = ("1f1b", "gpipe")  # strategy pipeline's; the first is the default
# The platform a run trained on, as its launcher names it. The trainer keeps no list of platforms: each is
# declared by its own package, dtlab/platforms/<name>/, and the harness checks the names it is given.
FRAMEWORK_PATTERN = "^[a-z][a-z0-9_]*$"
DEFAULT_FRAMEWORK = "ddp"  # torchrun's: the core's own hooks, and a config that names none
# A hub id is "name" or "owner/name"; anything else is treated as a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_SOURCE = {"minLength": 1, "message": "is empty; give a hub id or a local path"}


class ConfigError(ValueError):
    """A bad configuration value, found before training starts. The message is one line."""


# Every option says whether it is part of the config hash (what makes two runs the same experiment):
# hashed always; hashed only when set away from its default (options added after runs were recorded,
# so those runs keep their hash); or not hashed (where things go, labels, per-node resources).
# The keyword arguments are the option's JSON Schema rules (minimum, enum, ...; see SCHEMA below);
# message= replaces the generic error wording for them.
HASH_ALWAYS, HASH_IF_SET, NOT_HASHED = "always", "if set", "no"


def hashed(default, **rules):
    return _option(default, HASH_ALWAYS, rules)


def hashed_if_set(default, **rules):
    return _option(default, HASH_IF_SET, rules)


def not_hashed(default, **rules):
    return _option(default, NOT_HASHED, rules)


def _option(default, mark: str, rules: dict):
    if "message" in rules:
        rules["x-message"] = rules.pop("message")
    return dataclasses.field(default=default, metadata={"hash": mark, "schema": rules})


# Options of stock DDP's gradient all-reduce: strategy ddp only, and not under a launcher whose optimizer
# averages the gradients itself (Horovod; trainer.core refuses them there).
DDP_OPTIONS = ("sparse_embedding_sync", "ddp_static_graph")
# The strategies whose gradients go through DDP's all-reduce, so through its communication hooks.
COMPRESSING_STRATEGIES = ("ddp", "zero1")


@dataclasses.dataclass
class TrainConfig:
    # --- what to train on ---
    model: str = hashed("prajjwal1/bert-tiny", **_SOURCE)
    dataset: str = hashed("stanfordnlp/imdb", **_SOURCE)
    # The generated data's sizes are checked only when it is the dataset (SCHEMA's allOf).
    generated_train_size: int = hashed(25_000)
    generated_test_size: int = hashed(25_000)
    generated_median_words: int = hashed(230)  # IMDB-like review length; scale down for the CPU lab
    generated_seed: int = hashed(0)  # the data stays put when the training seed varies, as IMDB does
    # --- the study's protocol ---
    epochs: int = hashed(1, minimum=1)
    seed: int = hashed(42)
    batch_size: int = hashed(32, minimum=1)  # per worker
    # micro-batches of batch_size per optimizer step (gradient accumulation): one gradient sync per step
    grad_accum_steps: int = hashed_if_set(1, minimum=1)
    learning_rate: float = hashed(5e-5, exclusiveMinimum=0)
    weight_decay: float = hashed(0.01, minimum=0)
    warmup_steps: int = hashed(500, minimum=0)
    max_length: int = hashed(512, minimum=8, maximum=512,
                             message="must be between 8 and 512 (BERT's limit), got {value!r}")
    optimizer: str = hashed("adamw", enum=OPTIMIZERS)
    # how the model, gradients and optimizer state are spread over the workers (trainer/strategies/)
    strategy: str = hashed_if_set(strategies.DEFAULT, enum=strategies.NAMES)
    # strategy pipeline only: its schedule, and microbatches per step (None = one per stage, the world size)
    pipeline_schedule: str = hashed_if_set(PIPELINE_SCHEDULES[0], enum=PIPELINE_SCHEDULES)
    microbatches: int | None = hashed_if_set(None, minimum=1)
    # None = the model's own; 0 makes runs comparable across world sizes
    dropout: float | None = hashed(None, minimum=0, exclusiveMaximum=1,
                                   message="must be in [0, 1) or null (the model's own), got {value!r}")
    # --- speed ---
    group_by_length: bool = hashed(True)
    threads: int = not_hashed(1, minimum=1)  # CPU threads per worker
    device: str = not_hashed("auto", enum=DEVICES)
    mixed_precision: str = hashed("auto", enum=MIXED_PRECISIONS)  # bf16, fp16: CUDA only
    # loader processes; None = auto (0 on CPU, 2 on CUDA)
    num_workers: int | None = hashed(None, minimum=0)
    # batch width rounding; None = auto (1 CPU, 8 CUDA, 64 compiled)
    pad_to_multiple_of: int | None = hashed_if_set(None, minimum=1)
    # torch.compile; reduce-overhead = CUDA graphs
    compile: str = hashed_if_set("no", enum=COMPILE_MODES)
    deterministic: bool = hashed_if_set(False)  # torch.use_deterministic_algorithms: bit-exact reruns on CUDA
    # dtlab's opt-in: all-reduce only the touched embedding rows
    sparse_embedding_sync: bool = hashed_if_set(False)
    # DDP told that every step runs the same graph (static_graph): stock DDP set up at its best on CPU
    ddp_static_graph: bool = hashed_if_set(False)
    # gradient compression on the all-reduce, and PowerSGD's matrix approximation rank
    grad_compression: str = hashed_if_set(GRAD_COMPRESSIONS[0], enum=GRAD_COMPRESSIONS)
    powersgd_rank: int = hashed_if_set(1, minimum=1)
    # steady optimizer steps profiled on every rank (torch.profiler; 0: off): a profiled run is its own cell
    profile_steps: int = hashed_if_set(0, minimum=0)
    # --- where the tokens come from ---
    # loader: the trainer tokenizes into its cache and its DataLoader reads it; platform: the platform's own
    # ETL (Spark's, Ray Data's) reads, cleans and tokenizes the raw reviews (trainer/platform_data.py)
    data_path: str = hashed_if_set(DEFAULT_DATA_PATH, enum=DATA_PATHS)
    token_cache: bool = not_hashed(True)  # false: the loader tokenizes afresh (a cold start, as an ETL has)
    # --- where things go ---
    output_dir: str = not_hashed("out")
    checkpoint_dir: str | None = not_hashed(None)  # None = no checkpoints
    # Resume a checkpoint another number of workers wrote (elastic recovery: torchrun --nnodes=MIN:MAX or
    # Horovod Elastic going on with fewer workers). Not hashed: an undisturbed run is the same experiment
    # either way.
    elastic: bool = not_hashed(False)
    cache_dir: str | None = not_hashed(None)  # tokenized-split cache; None = <output_dir>/../token-cache
    platform_data_dir: str | None = not_hashed(None)  # data_path platform: a directory every node sees
    # --- labels ---
    framework: str = not_hashed(DEFAULT_FRAMEWORK, pattern=FRAMEWORK_PATTERN,
                                message="must be a platform's name (lowercase letters, digits, _), "
                                        "got {value!r}")
    framework_label: str | None = not_hashed(None)  # overrides the launcher's label in result.json

    def validate(self, *, local: bool = True) -> TrainConfig:
        """Check every value; raise ConfigError naming the first bad one. Returns self.

        local=False checks the values alone (the harness, on the controller, before any cell
        starts): no directory is created and local model or dataset paths are not looked up.
        """
        check(self.as_dict())
        # What a schema cannot say: the device rules out some options, and paths exist or not.
        if self.device == "cpu" and self.mixed_precision in ("bf16", "fp16"):
            raise ConfigError(f"mixed_precision: {self.mixed_precision} is CUDA-only; use auto or no on cpu")
        if self.device == "cpu" and self.compile == "reduce-overhead":
            raise ConfigError("compile: reduce-overhead captures CUDA graphs and is CUDA-only; "
                              "use default or no on cpu")
        for key in DDP_OPTIONS:
            if getattr(self, key) and self.strategy != strategies.DEFAULT:
                raise ConfigError(f"{key}: an optimisation of strategy {strategies.DEFAULT}'s gradient "
                                  f"all-reduce, not of {self.strategy}; set it to false")
        if self.grad_compression != "none" and self.strategy not in COMPRESSING_STRATEGIES:
            raise ConfigError(f"grad_compression: a DDP communication hook, which strategy {self.strategy} "
                              "has no use for or cannot take; use it with "
                              f"{' or '.join(COMPRESSING_STRATEGIES)}")
        if self.grad_compression != "none" and self.sparse_embedding_sync:
            raise ConfigError("grad_compression: not measured or tested together with sparse_embedding_sync "
                              "(which all-reduces the word embeddings' rows itself); set one of them off")
        if self.powersgd_rank != _FIELDS["powersgd_rank"].default and self.grad_compression != "powersgd":
            raise ConfigError("powersgd_rank: an option of grad_compression powersgd, not of "
                              f"{self.grad_compression}; leave it unset")
        if self.grad_accum_steps > 1 and self.strategy == "pipeline":
            raise ConfigError("grad_accum_steps: strategy pipeline already splits each step's batch into "
                              "microbatches (its schedule accumulates their gradients): raise microbatches "
                              "or batch_size instead, and leave grad_accum_steps at 1")
        if self.grad_accum_steps > 1 and self.sparse_embedding_sync:
            raise ConfigError("grad_accum_steps: not measured or tested together with sparse_embedding_sync "
                              "(which all-reduces the word embeddings' rows itself); set one of them off")
        if self.sparse_embedding_sync and self.ddp_static_graph:
            raise ConfigError("ddp_static_graph: not measured or tested together with sparse_embedding_sync "
                              "(which takes the word embeddings out of DDP); set one of them to false")
        for key in ("pipeline_schedule", "microbatches"):
            if self.strategy != "pipeline" and getattr(self, key) != _FIELDS[key].default:
                raise ConfigError(f"{key}: an option of strategy pipeline, not of {self.strategy}; "
                                  "leave it unset")
        if self.strategy == "pipeline" and self.compile != "no":
            raise ConfigError("compile: strategy pipeline runs its stages eagerly "
                              "(torch.distributed.pipelining calls each stage per microbatch); "
                              "use compile no")
        if self.strategy == "pipeline" and self.mixed_precision == "fp16":
            raise ConfigError("mixed_precision: fp16 needs loss scaling, which strategy pipeline cannot do "
                              "(its stages would skip different steps); use bf16 or no")
        if self.elastic and self.strategy != strategies.DEFAULT:
            raise ConfigError(f"elastic: resuming on another number of workers is tested with strategy "
                              f"{strategies.DEFAULT} alone, not {self.strategy}; set elastic false")
        if self.data_path == PLATFORM_DATA_PATH and not self.platform_data_dir:
            raise ConfigError("platform_data_dir: data_path platform reads the raw reviews from a directory "
                              "every node sees (a shared disk); set it")
        if local:
            if not self.model.startswith(GENERATED_MODEL_PREFIX):
                _check_source("model", self.model)
            if self.dataset != GENERATED_DATASET:
                _check_source("dataset", self.dataset)
            for key in ("output_dir", "checkpoint_dir", "cache_dir", "platform_data_dir"):
                if getattr(self, key) is not None:
                    _check_writable(key, Path(getattr(self, key)))
        return self

    @property
    def token_cache_dir(self) -> Path:
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        return Path(self.output_dir).resolve().parent / "token-cache"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


_UNMARKED = [f.name for f in dataclasses.fields(TrainConfig) if "hash" not in f.metadata]
if _UNMARKED:  # a new option must say whether it changes the experiment
    raise TypeError(f"TrainConfig: mark {_UNMARKED} with hashed(), hashed_if_set() or not_hashed()")


def config_hash(cfg: TrainConfig) -> str:
    """What makes two runs the same experiment: the hashed options, per their marks above."""
    hashed_values = {}
    for option in dataclasses.fields(cfg):
        value, mark = getattr(cfg, option.name), option.metadata["hash"]
        if mark == HASH_ALWAYS or (mark == HASH_IF_SET and value != option.default):
            hashed_values[option.name] = value
    return hashlib.sha256(json.dumps(hashed_values, sort_keys=True).encode()).hexdigest()[:16]


def known_model_shape(model: str) -> dict[str, int] | None:
    """A generated model's shape, or a published miniature's; None for any other model, whose shape is
    known only once it loads."""
    if model.startswith(GENERATED_MODEL_PREFIX):
        return GENERATED_MODEL_SHAPES.get(model.removeprefix(GENERATED_MODEL_PREFIX))
    return PUBLISHED_MODEL_SHAPES.get(model)


def is_local_path(source: str) -> bool:
    """True for a path on this machine; False for a hub id such as prajjwal1/bert-tiny."""
    return (source.startswith(("/", ".", "~")) or not _HUB_ID.match(source)
            or Path(source).expanduser().exists())


def _check_source(key: str, source: str) -> None:
    """A local path must exist here; a hub id is downloaded later."""
    if is_local_path(source) and not Path(source).expanduser().exists():
        raise ConfigError(f"{key}: local path {source} does not exist; stage it there or give a hub id")


def _check_writable(key: str, directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as error:
        raise ConfigError(f"{key}: {directory} is not writable ({error.strerror}); "
                          "choose a directory this user can write") from None


# --- the schema: every option's type and its rules, as JSON Schema ------------------

_FIELDS = {field.name: field for field in dataclasses.fields(TrainConfig)}
_TYPE_HINTS = typing.get_type_hints(TrainConfig)
_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string", type(None): "null"}


def _property(name: str) -> dict:
    types = [_JSON_TYPES[t] for t in (typing.get_args(_TYPE_HINTS[name]) or (_TYPE_HINTS[name],))]
    return {"type": types[0] if len(types) == 1 else types, **_FIELDS[name].metadata["schema"]}


_GENERATED_MODEL_PATTERN = "^" + re.escape(GENERATED_MODEL_PREFIX)


def _split_size() -> dict:
    return {"type": "integer", "minimum": 2, "maximum": GENERATED_MAX_SPLIT_SIZE}


# The options as plain data (a YAML file, a matrix profile, Determined hyperparameters; all of them or
# some): the trainer's own schema, which the harness's matrix schema refers to by its $id.
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "urn:trainer:config",
    "title": "trainer options (trainer.config.TrainConfig)",
    "type": "object",
    "additionalProperties": False,
    "x-key-noun": "trainer option",
    "x-key-help": "`python -m trainer.launchers.torchrun --help` lists them",
    "properties": {name: _property(name) for name in _FIELDS},
    "allOf": [
        {   # the generated data's sizes matter only when it is the dataset
            "if": {"required": ["dataset"], "properties": {"dataset": {"const": GENERATED_DATASET}}},
            "then": {"properties": {
                "generated_train_size": _split_size(),
                "generated_test_size": _split_size(),
                "generated_median_words": {"type": "integer", "minimum": 4},
            }},
        },
        {   # a generated model is one of the shapes the trainer can build
            "if": {"required": ["model"], "properties": {"model": {"pattern": _GENERATED_MODEL_PATTERN}}},
            "then": {"properties": {"model": {"enum": [GENERATED_MODEL_PREFIX + shape
                                                       for shape in GENERATED_MODEL_SHAPES]}}},
        },
    ],
}
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def check(options: dict) -> dict:
    """Raise ConfigError with the first of SCHEMA's complaints about these (typed) options; return them."""
    problem = first_error(_VALIDATOR, options)
    if problem is not None:
        raise ConfigError(problem)
    return options


# --- YAML and CLI ----------------------------------------------------------------

_HELP = {
    "model": "hub id, local model directory, or generated:bert-tiny|bert-mini|bert-small|bert-medium "
             "(the published miniature BERT shapes, built from config, nothing downloaded)",
    "dataset": "stanfordnlp/imdb, a local path or saved dataset, or 'generated' (IMDB-like, from the seed)",
    "generated_train_size": "reviews in the generated train split (<= 500000)",
    "generated_test_size": "reviews in the generated test split (<= 500000)",
    "generated_median_words": "median review length of the generated data, in words (IMDB: ~230)",
    "generated_seed": "seed of the generated data (fixed while --seed varies, as IMDB is)",
    "epochs": "epochs to train",
    "seed": "seed for the initial weights, data order and dropout",
    "batch_size": "batch size per worker (the global batch is this x world size under every strategy)",
    "learning_rate": "AdamW peak learning rate",
    "weight_decay": "AdamW weight decay",
    "warmup_steps": "linear warmup steps, then linear decay to 0 over the whole run",
    "max_length": "max tokens per review; longer ones are truncated",
    "grad_accum_steps": "micro-batches of batch_size each worker runs before one optimizer step (gradient "
                        "accumulation): the global batch is batch_size x workers x N, and gradients are "
                        "synchronised once per step (DDP's no_sync, FSDP's requires_gradient_sync, "
                        "Horovod's backward_passes_per_step); not with strategy pipeline",
    "grad_compression": "none, fp16, bf16 or powersgd: the gradient all-reduce compressed by a DDP "
                        "communication hook (strategies ddp and zero1), or by Horovod's fp16 compression "
                        "(fp16 alone); labelled in results",
    "powersgd_rank": "grad_compression powersgd's matrix approximation rank (default 1)",
    "profile_steps": "profile N steady optimizer steps of the first epoch on every rank with torch.profiler "
                     "(0: off): time in data loading, forward and backward, the optimizer and the "
                     "collectives, the top operators and peak memory, in result.json's step_profile; a "
                     "profiled run is labelled and hashed apart from timed ones",
    "optimizer": "adamw (the study) or sgd (only for the DDP-equivalence test)",
    "strategy": f"{', '.join(strategies.NAMES)}: ddp, ZeRO stage 1 over ddp, FSDP2 resharding after "
                "forward (ZeRO-3-like) or keeping parameters gathered (ZeRO-2-like), or tensor parallelism "
                "over all workers (heads and MLP split; every worker sees the same batches), or pipeline "
                "parallelism (the encoder's layers split into one stage per worker; every worker sees the "
                "same batches)",
    "pipeline_schedule": "strategy pipeline's schedule: 1f1b (one forward, one backward: fewer activations "
                         "held) or gpipe (all forwards, then all backwards)",
    "microbatches": "strategy pipeline's microbatches per step (default: one per stage, the world size); "
                    "must divide the global batch (batch_size x world size); 1f1b needs >= the world size",
    "dropout": "override the model's dropout (null = the model's own)",
    "group_by_length": "batch reviews of similar length together (per rank, deterministic)",
    "threads": "CPU threads per worker (torch.set_num_threads)",
    "device": "auto, cpu or cuda",
    "mixed_precision": "auto, no, bf16 or fp16 (CUDA only; auto = bf16 on compute capability >= 8.0, "
                       "fp16 with a GradScaler on 7.x, fp32 below)",
    "num_workers": "data-loader processes per worker (auto: 0 on CPU, 2 on CUDA)",
    "pad_to_multiple_of": "round each batch's width up to a multiple of N (auto: 1 on CPU, 8 on CUDA, "
                          "64 when compiled, so few shapes)",
    "compile": "no, default or reduce-overhead: torch.compile the model (reduce-overhead adds CUDA graphs; "
               "CUDA only); labelled in results",
    "deterministic": "deterministic CUDA kernels (torch.use_deterministic_algorithms), for bit-exact reruns",
    "sparse_embedding_sync": "not stock DDP: all-reduce only the word-embedding rows the batches touched "
                             "(a dtlab optimisation, labelled in results)",
    "ddp_static_graph": "stock DDP told the graph is the same every step (static_graph=True), which lets it "
                        "plan its all-reduce once; the same numbers, labelled in results",
    "data_path": "loader (the trainer tokenizes; its DataLoader reads) or platform (Spark's or Ray Data's "
                 "own ETL reads, cleans and tokenizes the raw reviews: Spark and Ray launchers only)",
    "token_cache": "reuse the tokenized splits of an earlier run (false: tokenize afresh, a cold start)",
    "platform_data_dir": "data_path platform: where the raw reviews are staged and the ETL writes, a "
                         "directory every node sees",
    "output_dir": "where rank 0 writes result.json",
    "checkpoint_dir": "per-epoch checkpoints and resume (null/none = off)",
    "elastic": "resume a checkpoint that another number of workers wrote (elastic recovery; strategy ddp)",
    "cache_dir": "tokenized-split cache shared by runs (default: <output_dir>/../token-cache)",
    "framework": "the platform's name, as its launcher sets it (dtlab/platforms/<name>/)",
    "framework_label": "what the run really was, written to result.json (default: the launcher's)",
}
