"""The model: BertForSequenceClassification, 2 labels, from the hub, a local directory, or config alone."""

from __future__ import annotations

from trainer.config import GENERATED_MODEL_PREFIX, GENERATED_MODEL_SHAPES, ConfigError, TrainConfig

NUM_LABELS = 2


def build_model(cfg: TrainConfig):
    """Seed before calling: a model built from config is randomly initialised from torch's RNG."""
    from transformers import BertConfig, BertForSequenceClassification

    overrides = {}
    if cfg.dropout is not None:
        overrides = dict(hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
                         classifier_dropout=cfg.dropout)
    if cfg.model.startswith(GENERATED_MODEL_PREFIX):
        shape = GENERATED_MODEL_SHAPES[cfg.model.removeprefix(GENERATED_MODEL_PREFIX)]
        model = BertForSequenceClassification(BertConfig(num_labels=NUM_LABELS, **shape, **overrides))
    else:
        try:
            model = BertForSequenceClassification.from_pretrained(cfg.model, num_labels=NUM_LABELS,
                                                                  **overrides)
        except Exception as error:  # hub, file and format errors; the user needs one line
            raise ConfigError(f"model: cannot load {cfg.model} ({type(error).__name__}: "
                              f"{str(error).splitlines()[0][:200]}); stage it locally or check the id"
                              ) from None
    if cfg.max_length > model.config.max_position_embeddings:
        raise ConfigError(f"max_length: {cfg.max_length} exceeds the model's "
                          f"{model.config.max_position_embeddings} positions; lower it")
    return model


RECOMPILE_LIMIT = 64  # widths x batch sizes x train/eval; torch's default (8) would fall back to eager


def compiled(mode: str, parallel_model, eval_model):
    """torch.compile (compile: default or reduce-overhead) for training (the strategy's module) and for
    validation (its eval model)."""
    import torch
    import torch._dynamo

    for limit in ("recompile_limit", "cache_size_limit"):  # the name changed across torch releases
        if hasattr(torch._dynamo.config, limit):
            current = getattr(torch._dynamo.config, limit)
            setattr(torch._dynamo.config, limit, max(current, RECOMPILE_LIMIT))
    torch_mode = None if mode == "default" else mode
    return torch.compile(parallel_model, mode=torch_mode), torch.compile(eval_model, mode=torch_mode)
