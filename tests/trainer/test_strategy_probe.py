"""benchmarks/strategies.py's own measurements, checked against what each strategy must send: 2 CPU
workers on gloo under the benchmark's probe, bert-tiny, every review longer than max_length."""

import sys
from pathlib import Path

import pytest
from transformers import BertConfig, BertForSequenceClassification

from tests.trainer.conftest import TINY
from trainer.config import GENERATED_MODEL_SHAPES, TrainConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import strategies as strategies_benchmark  # noqa: E402

pytestmark = pytest.mark.slow  # three 2-worker profiled runs (~50 s)

WORKERS, BATCH, WIDTH = 2, 4, 32
STEPS = 10  # the probe profiles steps 7 to 9


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("strategy-probe")
    # 640 median words: the shortest review (1/20 of it) still fills max_length, so every batch is WIDTH wide.
    cfg = TrainConfig(**{**TINY, "generated_train_size": STEPS * BATCH * WORKERS, "generated_test_size": 16,
                         "generated_median_words": 640, "max_length": WIDTH, "batch_size": BATCH, "epochs": 1,
                         "cache_dir": str(work / "cache"), "output_dir": str(work / "out")}).validate()
    return {name: strategies_benchmark.run_once(
                {**cfg.as_dict(), **strategies_benchmark.contender_options(name)}, WORKERS, work,
                name.replace(":", "-"))
            for name in ("ddp", "fsdp", "pipeline:m4")}


def test_bytes_sent_per_step_are_what_each_strategy_must_send(runs):
    for name, run in runs.items():
        assert "failed" not in run, f"{name}: {run.get('failed')}"
        assert run["unknown_c10d_ops"] == []
    shape = GENERATED_MODEL_SHAPES["bert-tiny"]
    model = BertForSequenceClassification(BertConfig(**shape))
    parameter_mb = 4 * sum(p.numel() for p in model.parameters()) / 1e6
    # ddp: one all-reduce of every gradient, 2(n-1)/n of it on the wire = all of it at 2 workers, plus the
    # buffers DDP broadcasts before each forward (position and token type ids: kilobytes).
    assert parameter_mb <= runs["ddp"]["sent_mb_per_step"] <= parameter_mb * 1.001
    assert runs["ddp"]["c10d_calls_per_step"]["c10d::allreduce_"] >= 1
    # fsdp (resharding after forward): all-gather for the forward and again for the backward, then a
    # reduce-scatter of the gradients, (n-1)/n each: 1.5x ddp's bytes at 2 workers (shards padded slightly).
    assert runs["fsdp"]["sent_mb_per_step"] == pytest.approx(1.5 * parameter_mb, rel=0.01)
    # pipeline: stage 0 sends each microbatch's hidden states forward, stage 1 their gradients back, in
    # fp32: the global batch x WIDTH x hidden, from each rank, in 4 microbatches.
    assert runs["pipeline:m4"]["sent_mb_per_step"] * 1e6 == BATCH * WORKERS * WIDTH * shape["hidden_size"] * 4
    assert runs["pipeline:m4"]["c10d_calls_per_step"]["c10d::send"] == 4


def test_the_pipeline_idle_fraction_is_measured_and_the_others_have_none(runs):
    assert 0 < runs["pipeline:m4"]["idle_fraction"] < 1
    assert runs["ddp"]["idle_fraction"] is None and runs["fsdp"]["idle_fraction"] is None


@pytest.mark.core
def test_a_contender_that_is_not_a_strategy_is_refused_in_one_line():
    with pytest.raises(SystemExit, match="'pipe' is not one of"):
        strategies_benchmark.contender_options("pipe")
    with pytest.raises(SystemExit, match="option 'x3' is neither"):
        strategies_benchmark.contender_options("pipeline:x3")
