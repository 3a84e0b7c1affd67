"""The training core in this process (a 1-process gloo group): result, learning, checkpoints, resume."""

import json

import jsonschema
import pytest
import torch
import torch.distributed as dist

from tests.trainer.conftest import StopAfter, final_weights, max_weight_difference
from trainer.checkpoint import latest_checkpoint
from trainer.config import ConfigError
from trainer.core import prepared, train
from trainer.result import load_schema, validate_result


def test_single_process_run_writes_a_valid_result(make_config, tmp_path):
    cfg = make_config(epochs=2, generated_train_size=128)
    result = train(cfg)
    on_disk = json.loads((tmp_path / "out" / "result.json").read_text())
    validate_result(on_disk)
    assert on_disk == result
    assert (result["framework"], result["framework_label"], result["world_size"], result["device"]) == \
        ("ddp", "ddp (torchrun)", 1, "cpu")
    assert (result["backend"], result["gpus"], result["nodes"]) == ("gloo", 0, 1)
    assert [m["epoch"] for m in result["epoch_metrics"]] == [1, 2]
    assert all(m["train_samples"] == cfg.generated_train_size for m in result["epoch_metrics"])
    epoch_time = sum(m["train_time_s"] + m["val_time_s"] for m in result["epoch_metrics"])
    assert epoch_time <= result["time_total_s"] <= epoch_time + 5
    assert result["peak_memory_mb"]["rss"] > 100
    assert result["resumed_from_epoch"] is None
    marks = result["timeline_unix"]  # the node's half of the whole-run clock
    in_order = ("process_started", "core_entered", "training_started", "first_step_done", "training_ended")
    assert [marks[name] for name in in_order] == sorted(marks[name] for name in in_order)
    assert not dist.is_initialized()  # the core removes the group it created
    # Spark's executor and driver, Ray's driver unpickle the returned result: builtins only, so that no
    # import comes with it (torch.__version__, a TorchVersion, imported torch there: 1.06 s, twice per cell).
    assert not_builtin(result) == []


def not_builtin(value, path: str = "result") -> list[str]:
    """Where a JSON-like value holds a type that is not exactly a builtin (a subclass pickles by
    reference)."""
    if type(value) is dict:
        return [found for key, item in value.items() for found in not_builtin(item, f"{path}[{key!r}]")]
    if type(value) is list:
        return [found for index, item in enumerate(value) for found in not_builtin(item, f"{path}[{index}]")]
    plain = (str, int, float, bool, type(None))
    return [] if type(value) in plain else [f"{path}: {type(value).__module__}.{type(value).__qualname__}"]


def test_training_runs_without_cudnn_attention_and_gives_the_setting_back(make_config):
    """cuDNN's attention plans per input shape, and dynamic padding changes the width most batches (on
    an H100, 3.5x the bf16 step): the core turns it off while it trains and restores the caller's choice."""
    torch.backends.cuda.enable_cudnn_sdp(True)  # torch's default
    with prepared(make_config(generated_train_size=16, epochs=1)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    # Also when the run is refused before it starts (here: device cuda where torch sees no GPU).
    with pytest.raises(ConfigError), prepared(make_config(device="cuda")):
        pass
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_schema_rejects_a_broken_result(make_config):
    result = train(make_config(epochs=1))
    del result["final_accuracy"]
    with pytest.raises(jsonschema.ValidationError, match="final_accuracy"):
        validate_result(result)
    assert "final_accuracy" in load_schema()["required"]


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_learns_the_generated_signal(make_config):
    # ~130 steps on one core: random bert-tiny weights reach >= 0.95 accuracy. At lr 1e-3 the last epoch
    # can dip (0.92-0.96 seen across runs in one pytest session), so the best epoch is what must get there.
    result = train(make_config(generated_train_size=1024, generated_test_size=256, batch_size=32, epochs=4,
                               learning_rate=1e-3, warmup_steps=5))
    accuracies = [m["val_accuracy"] for m in result["epoch_metrics"]]
    assert max(accuracies) >= 0.95, accuracies
    assert result["final_accuracy"] >= 0.85, accuracies
    assert result["epoch_metrics"][-1]["val_loss"] < result["epoch_metrics"][0]["val_loss"]


@pytest.mark.slow  # over 10 s on 2 cores: not in `invoke test --fast`
def test_stopped_then_resumed_run_matches_an_unbroken_run(make_config, tmp_path):
    # Dropout stays on: an exact match needs the RNG states from the checkpoint.
    unbroken_cfg = make_config(epochs=3, checkpoint_dir=str(tmp_path / "unbroken"),
                               output_dir=str(tmp_path / "unbroken-out"))
    unbroken = train(unbroken_cfg)
    assert sorted(p.name for p in (tmp_path / "unbroken").iterdir()) == ["epoch-0002", "epoch-0003"]  # pruned

    resumed_cfg = make_config(epochs=3, checkpoint_dir=str(tmp_path / "resumed"),
                              output_dir=str(tmp_path / "resumed-out"))
    stopper = StopAfter(epoch=1)
    assert train(resumed_cfg, stopper) is None
    assert stopper.seen == [1]
    assert latest_checkpoint(tmp_path / "resumed").name == "epoch-0001"
    assert not (tmp_path / "resumed-out" / "result.json").exists()

    resumed = train(resumed_cfg)
    assert resumed["resumed_from_epoch"] == 1
    for key in ("val_loss", "val_accuracy", "train_loss", "train_samples"):
        assert [m[key] for m in resumed["epoch_metrics"]] == [m[key] for m in unbroken["epoch_metrics"]], key
    unbroken_weights = final_weights(tmp_path / "unbroken", 3)
    assert max_weight_difference(unbroken_weights, final_weights(tmp_path / "resumed", 3)) == 0.0


def test_a_finished_run_resumes_to_its_result_without_training(make_config, tmp_path):
    cfg = make_config(epochs=1, checkpoint_dir=str(tmp_path / "ckpt"))
    first = train(cfg)
    again = train(cfg)
    assert again["resumed_from_epoch"] == 1
    assert again["epoch_metrics"] == first["epoch_metrics"]


def test_checkpoint_from_another_config_is_refused(make_config, tmp_path):
    train(make_config(epochs=1, checkpoint_dir=str(tmp_path / "ckpt")))
    with pytest.raises(ConfigError, match="checkpoint_dir: the checkpoint was written by a different config"):
        train(make_config(epochs=1, seed=5, checkpoint_dir=str(tmp_path / "ckpt")))
    assert not dist.is_initialized()


@pytest.mark.core
@pytest.mark.slow  # its teardown waits ~25 s on 2 cores: not in `invoke test --fast`
def test_checkpoint_trained_on_other_tokens_is_refused(make_config, tmp_path):
    # Same config, other tokens: e.g. a checkpoint from before the tokenizer changed, or a re-staged dataset.
    import torch

    from trainer.checkpoint import checkpoint_file

    cfg = make_config(epochs=1, checkpoint_dir=str(tmp_path / "ckpt"))
    first = train(cfg)
    assert len(first["data_fingerprint"]) == 24
    path = checkpoint_file(latest_checkpoint(tmp_path / "ckpt"))
    state = torch.load(path, weights_only=False)
    assert state["data_fingerprint"] == first["data_fingerprint"]
    state["data_fingerprint"] = "0" * 24
    torch.save(state, path)
    with pytest.raises(ConfigError, match="checkpoint_dir: the checkpoint was trained on other tokens"):
        train(cfg)
