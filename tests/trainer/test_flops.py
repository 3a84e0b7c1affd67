"""MFU's numerator (trainer/flops.py, issue #55): the model's FLOPs from its shapes, against torch's own
FLOP counter on the real model, and as every run records them."""

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForSequenceClassification

from trainer.config import GENERATED_MODEL_SHAPES
from trainer.core import train
from trainer.data import tokenized_splits
from trainer.flops import EncoderShape, forward_flops, training_flops


@pytest.mark.parametrize("name", ["bert-tiny", "bert-mini"])
@pytest.mark.parametrize("length", [7, 64])
def test_the_count_from_shapes_is_torchs_count_of_the_real_models_matmuls(name, length):
    """Forward, and forward and backward, of one review: what torch.utils.flop_counter counts on
    BertForSequenceClassification (eager attention: its matmuls, which sdpa fuses into one op)."""
    config = BertConfig(num_labels=2, attn_implementation="eager", **GENERATED_MODEL_SHAPES[name])
    model = BertForSequenceClassification(config)
    ids = torch.randint(5, 1000, (1, length))
    with FlopCounterMode(display=False) as forward:
        model(input_ids=ids, labels=torch.tensor([1]))
    with FlopCounterMode(display=False) as both:
        model(input_ids=ids, labels=torch.tensor([1])).loss.backward()
    shape = EncoderShape.of(config)
    assert forward_flops(shape, length) == forward.get_total_flops() > 0
    assert training_flops(shape, [length]) == both.get_total_flops()


def test_each_review_counts_at_its_own_length_not_its_batchs_padding():
    shape = EncoderShape.of({"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 512,
                             "num_labels": 2})
    assert training_flops(shape, [10, 60]) == 3 * (forward_flops(shape, 10) + forward_flops(shape, 60))
    assert training_flops(shape, [10, 60]) < training_flops(shape, [60, 60])  # what padding would cost
    assert training_flops(shape, []) == 0


def test_a_run_records_the_flops_of_one_epoch_over_its_train_split(make_config):
    cfg = make_config(epochs=1, generated_train_size=64)
    result = train(cfg)
    lengths = np.diff(tokenized_splits(cfg)["train"].offsets)
    shape = EncoderShape.of({**GENERATED_MODEL_SHAPES[cfg.model.removeprefix("generated:")], "num_labels": 2})
    assert result["model_flops_per_epoch"] == training_flops(shape, lengths) > 0
    peak = result["device_peak"]  # MFU's denominator on CPU: what rank 0's thread reached, and how
    assert 1e8 < peak["flops_per_s"] < 1e13
    assert peak["source"].startswith("measured: fp32 GEMM 512x512 on 1 thread of rank 0")
    assert result["energy"]["joules"] is None and "no GPU on this rank" in result["energy"]["why_not"]
