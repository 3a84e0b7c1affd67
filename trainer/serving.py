"""Serving a trained run (scenario C, issue #54): its newest checkpoint behind one request path.

Both servers answer the same `POST /predict` with the same `Predictor`: the plain baseline
(trainer.launchers.serve, one uvicorn process per worker) and Ray Serve's deployment
(trainer.launchers.ray_serve, its replicas on the workers). A request holds 1 to MAX_TEXTS reviews as
raw text; the answer is one label per review, from the trainer's own tokenizer (truncated to the run's
max_length) and model. `expected_predictions` is the trainer's own evaluation of the test split with the
same checkpoint, in the batches its validation ran: the answers a load test checks every response
against (dtlab/serving).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, Field

from trainer import checkpoint
from trainer.batches import PaddedBatches, padding_multiple, validation_batches
from trainer.config import ConfigError, TrainConfig, config_hash
from trainer.data import load_tokenizer, text_source, tokenized_splits
from trainer.distributed import resolve_device
from trainer.model import build_model

MAX_TEXTS = 64  # reviews in one request: a load test's requests hold one; a client's batch is bounded


class PredictRequest(BaseModel):
    texts: list[str] = Field(min_length=1, max_length=MAX_TEXTS)


class PredictResponse(BaseModel):
    labels: list[int]


def served_checkpoint(cfg: TrainConfig) -> tuple[Path, dict]:
    """(the newest checkpoint in cfg.checkpoint_dir, its state), refused in one line if there is none or
    another config trained it."""
    if not cfg.checkpoint_dir:
        raise ConfigError("checkpoint_dir: a served run needs the checkpoint_dir it trained with")
    found = checkpoint.latest_checkpoint(cfg.checkpoint_dir)
    if found is None:
        raise ConfigError(f"checkpoint_dir: no checkpoint in {cfg.checkpoint_dir}; train the run first")
    state = checkpoint.load(found)
    if state["config_hash"] != config_hash(cfg):
        raise ConfigError(f"checkpoint_dir: {found} was trained with another config "
                          f"({state['config_hash']} != {config_hash(cfg)}); serve with the run's own config")
    return found, state


class Predictor:
    """The run's model with its newest checkpoint's weights, in eval mode, on this node's device."""

    def __init__(self, cfg: TrainConfig):
        cfg.validate()
        torch.set_num_threads(cfg.threads)
        self.cfg, self.device = cfg, resolve_device(cfg)
        self.checkpoint, state = served_checkpoint(cfg)
        self.epoch, self.world_size = state["epoch"], state["world_size"]
        torch.manual_seed(cfg.seed)  # build_model initialises before the weights are loaded
        self.model = build_model(cfg)
        self.model.load_state_dict(state["model"])
        self.model.to(self.device).eval()
        self.tokenizer = load_tokenizer(cfg)
        self.tokenizer.enable_truncation(cfg.max_length)  # as the token cache was built
        self.pad_multiple = padding_multiple(cfg, self.device.type == "cuda")  # as the core pads

    @torch.inference_mode()
    def logits(self, batch: dict) -> torch.Tensor:
        inputs = {key: batch[key].to(self.device) for key in ("input_ids", "attention_mask")}
        return self.model(**inputs).logits.float()

    def predict(self, texts: list[str]) -> list[int]:
        """One label per review: raw text in, the trainer's tokens and model's argmax out."""
        encoded = [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]
        width = -(-max(map(len, encoded)) // self.pad_multiple) * self.pad_multiple
        input_ids = torch.zeros((len(encoded), width), dtype=torch.long)
        attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, ids in enumerate(encoded):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            attention_mask[row, :len(ids)] = 1
        logits = self.logits({"input_ids": input_ids, "attention_mask": attention_mask})
        return logits.argmax(dim=-1).tolist()


def expected_predictions(predictor: Predictor) -> dict:
    """The trainer's own evaluation of the test split with the predictor's checkpoint: the label it gives
    each review (in the split's order), from the batches each data-parallel rank validated, and the
    accuracy they make (the run's recorded val_accuracy for that epoch)."""
    cfg = predictor.cfg
    test = tokenized_splits(cfg, log=lambda _: None)["test"]
    batches = PaddedBatches(test, pad_to_multiple_of=predictor.pad_multiple)
    labels = np.full(len(test), -1, dtype=np.int64)
    for share in range(predictor.world_size):  # ddp's layout: one share a rank, batch_size each
        for indices in validation_batches(test.lengths, share, predictor.world_size, cfg.batch_size):
            labels[indices] = predictor.logits(batches[indices]).argmax(dim=-1).numpy()
    return {"checkpoint": str(predictor.checkpoint), "epoch": predictor.epoch, "labels": labels.tolist(),
            "accuracy": float((labels == np.asarray(test.labels)).mean())}


def test_reviews(cfg: TrainConfig) -> list[str]:
    """The test split's raw reviews in its order: what expected_predictions labels, as text."""
    return list(text_source(cfg).load()["test"]["text"])
