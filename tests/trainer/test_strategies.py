"""Parallelism strategies against ddp, for real: 2 CPU workers on gloo under torchrun, the same global
batch, fp32, dropout off, one seed; then each killed after its first checkpoint and resumed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import (
    SUBPROCESS_TIMEOUT_S,
    TINY,
    StopAfter,
    final_weights,
    free_loopback_port,
    kill_after_first_checkpoint,
    max_weight_difference,
    run,
    stage_model_directory,
    torchrun_command,
    trainer_env,
    write_config,
)
from trainer import strategies
from trainer.config import SCHEMA, ConfigError, TrainConfig, config_hash
from trainer.core import TrainHooks, train
from trainer.data import load_tokenizer
from trainer.model import build_model
from trainer.result import load_schema, validate_result

SHARDING = [name for name in strategies.NAMES if name != strategies.DEFAULT]
# (largest relative difference from ddp allowed in any epoch's train loss, val loss or val accuracy,
# largest absolute difference in any final weight). Measured on CPU, 2 gloo workers, torch 2.13.0
# (accuracy 0.59, 0.54, 0.94 over these runs' 3 epochs).
# - zero1 and the FSDP two: 0.0 for each, bit for bit. With two ranks the gradient average is one
#   addition and a halving, exact whichever collective computes it (all-reduce, reduce-scatter), and
#   AdamW is elementwise, so sharding its state or the weights changes no arithmetic. The bound leaves
#   room for more ranks or NCCL, where a sum of three or more gradients may round differently.
# - tensor: not bit for bit. Each rank multiplies by half of a matrix and the halves' partial sums are
#   all-reduced, and one rank's batch of 16 reviews is padded to its longest where ddp's two batches of 8
#   are padded each to its own, so sums run in another order: measured 2.1e-7 in the losses (0.0 in
#   accuracy) and 2.8e-5 in a weight after 3 epochs of AdamW.
# - pipeline: not bit for bit. Both stages see the batch of 16, cut into two microbatches of 8 (the first
#   and last 8 reviews, not ddp's interleaved halves), each padded to the batch's longest; each
#   microbatch's loss is its summed cross-entropy over 16 and the two gradients add up (ddp averages two
#   means of 8). Measured 6.7e-8 in the losses (0.0 in accuracy) and 2.7e-5 in a weight after 3 epochs; the
#   checkpoint holds ddp's keys and ddp's optimizer layout (measured 3.6e-7 in AdamW's moments).
TOLERANCE = {
    "zero1": (1e-6, 1e-6),  # measured 0.0: DDP's all-reduce, AdamW stepped per shard, weights broadcast
    "fsdp": (1e-6, 1e-6),  # measured 0.0: reduce-scattered gradients, sharded AdamW, all-gather per layer
    "fsdp_no_reshard": (1e-6, 1e-6),  # measured 0.0: as fsdp, one all-gather fewer per layer
    "tensor": (1e-6, 1e-4),  # measured 2.1e-7 and 2.8e-5: split matmuls, partial sums all-reduced
    "pipeline": (1e-6, 1e-4),  # measured 6.7e-8 and 2.7e-5: one batch of 16, two microbatches of 8
}
# 129 test reviews: rank 0 validates 65 (9 batches of 8), rank 1 64 (8), so a sharded model's validation
# must join the other rank's weight gathers once more. Batches not grouped by length: then the batch of 16
# both tensor ranks see holds the reviews ddp's two ranks' batches of 8 hold together (grouped, each ddp
# rank sorts its own half).
COMPARED = dict(TINY, dropout=0.0, epochs=3, generated_test_size=129, group_by_length=False)


def test_every_strategy_has_a_stated_tolerance_and_one_list_of_names():
    assert set(TOLERANCE) == set(SHARDING)
    assert list(SCHEMA["properties"]["strategy"]["enum"]) == list(strategies.NAMES)
    assert load_schema()["properties"]["hyperparameters"]["properties"]["strategy"]["enum"] == list(
        strategies.NAMES)


def test_the_strategy_enters_the_config_hash_once_set_away_from_the_default():
    # The default adds nothing, so runs recorded before the option existed keep their hash.
    hashes = {config_hash(TrainConfig(strategy=name)) for name in strategies.NAMES}
    assert len(hashes) == len(strategies.NAMES)
    assert config_hash(TrainConfig(strategy=strategies.DEFAULT)) == config_hash(TrainConfig())


def test_an_unknown_strategy_is_refused_in_one_line(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "trainer.launchers.torchrun", "--strategy", "zero3",
         "--output-dir", str(tmp_path)], env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip() == (
        "trainer: error: strategy: must be one of ddp, zero1, fsdp, fsdp_no_reshard, tensor, pipeline; "
        "got 'zero3'")


@pytest.mark.parametrize("option", ["sparse_embedding_sync", "ddp_static_graph"])
@pytest.mark.parametrize("strategy", SHARDING)
def test_a_ddp_option_is_refused_with_another_strategy(make_config, strategy, option):
    with pytest.raises(ConfigError, match=f"^{option}: an optimisation of strategy ddp's "
                                          f"gradient all-reduce, not of {strategy}; set it to false$"):
        make_config(strategy=strategy, **{option: True})


def test_the_two_ddp_options_are_refused_together(make_config):
    with pytest.raises(ConfigError, match="^ddp_static_graph: not measured or tested together with "
                                          "sparse_embedding_sync"):
        make_config(sparse_embedding_sync=True, ddp_static_graph=True)


@pytest.mark.core
@pytest.mark.slow
def test_tensor_parallelism_over_workers_that_do_not_divide_the_heads_is_refused_in_one_line(
        make_config, tmp_path):
    # A BERT with 3 heads, staged as a local model directory, over 2 workers (this machine refuses more
    # workers than CPUs): every worker refuses before its first step.
    from transformers import BertConfig, BertForSequenceClassification

    wordpiece = load_tokenizer(make_config())
    shape = BertConfig(vocab_size=wordpiece.get_vocab_size(), hidden_size=96, num_hidden_layers=1,
                       num_attention_heads=3, intermediate_size=384, num_labels=2)
    stage_model_directory(BertForSequenceClassification(shape), wordpiece, tmp_path / "model")
    cfg = make_config(model=str(tmp_path / "model"), strategy="tensor", epochs=1)
    command = torchrun_command(2, "--config", str(write_config(cfg, tmp_path / "run.yml")))
    completed = run(command, check=False)
    assert completed.returncode != 0
    errors = {line for line in completed.stderr.splitlines() if line.startswith("trainer: error:")}
    assert errors == {"trainer: error: strategy: tensor splits the model's 3 attention heads over the 2 "
                      "workers, which does not divide them; use a world size that divides 3, or another "
                      "strategy"}, completed.stderr
    assert not (tmp_path / "out" / "result.json").exists()


def test_pipeline_over_more_workers_than_encoder_layers_is_refused_in_one_line(make_config):
    # bert-tiny has 2 encoder layers. The strategy refuses in wrap_model, before anything is sent; this
    # machine has too few CPUs to start 3 workers, so the strategy is asked as rank 0 of 3.
    cfg = make_config(strategy="pipeline")
    hooks = TrainHooks()
    hooks.cfg = cfg
    strategy = strategies.load("pipeline", torch.device("cpu"), 0, 3)
    with pytest.raises(ConfigError, match="^strategy: pipeline puts at least one of the model's 2 encoder "
                                          "layers on each of the 3 workers; use at most 2 workers, or "
                                          "another strategy$"):
        strategy.wrap_model(build_model(cfg), hooks)


@pytest.mark.parametrize("option", [{"pipeline_schedule": "gpipe"}, {"microbatches": 4}],
                         ids=lambda option: next(iter(option)))
@pytest.mark.parametrize("strategy", [name for name in strategies.NAMES if name != "pipeline"])
def test_pipeline_options_are_refused_with_another_strategy(make_config, strategy, option):
    key = next(iter(option))
    with pytest.raises(ConfigError, match=f"^{key}: an option of strategy pipeline, not of {strategy}; "
                                          "leave it unset$"):
        make_config(strategy=strategy, **option)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"compile": "default"},
     "compile: strategy pipeline runs its stages eagerly (torch.distributed.pipelining calls each stage per "
     "microbatch); use compile no"),
    ({"device": "auto", "mixed_precision": "fp16"},
     "mixed_precision: fp16 needs loss scaling, which strategy pipeline cannot do (its stages would skip "
     "different steps); use bf16 or no"),
])
def test_pipeline_refuses_compile_and_fp16_in_one_line(make_config, overrides, message):
    with pytest.raises(ConfigError) as error:
        make_config(strategy="pipeline", **overrides)
    assert str(error.value) == message


def test_the_pipeline_options_enter_the_config_hash_only_once_set():
    assert config_hash(TrainConfig(strategy="pipeline", pipeline_schedule="1f1b", microbatches=None)) == (
        config_hash(TrainConfig(strategy="pipeline")))
    hashes = {config_hash(TrainConfig(strategy="pipeline", **option))
              for option in ({}, {"pipeline_schedule": "gpipe"}, {"microbatches": 4})}
    assert len(hashes) == 3


def test_pipeline_microbatches_give_the_full_batch_gradient(make_config):
    # In process, one worker (one stage): the same batch of 8 as 1, 2 (GPipe), 4 and 8 microbatches, and
    # through the unpipelined model. Each microbatch's loss is its summed loss over the batch's 8 rows and the
    # schedule leaves the gradients unscaled, so the sum of the microbatches' gradients is the batch's.
    # Measured (CPU, torch 2.13): 1 microbatch bit for bit; 2, 4, 8 within 6.4e-8 (summation order).
    from trainer.core import prepared

    gradients, losses = {}, {}
    for microbatches, schedule in ((1, "1f1b"), (2, "gpipe"), (4, "1f1b"), (8, "1f1b")):
        cfg = make_config(strategy="pipeline", microbatches=microbatches, pipeline_schedule=schedule,
                          dropout=0.0)
        with prepared(cfg) as run:
            batch = run._to_device(next(iter(run.train_loader)))
            losses[microbatches] = run.strategy.forward_backward(
                batch, run.forward, run.backward, run._autocast).item()
            gradients[microbatches] = {name: parameter.grad.clone()
                                       for name, parameter in run.model.named_parameters()}
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    whole = model(**batch)
    whole.loss.backward()
    for microbatches, gradient in gradients.items():
        assert gradient.keys() == dict(model.named_parameters()).keys()
        worst = max((gradient[name] - parameter.grad).abs().max().item()
                    for name, parameter in model.named_parameters())
        assert worst <= (0.0 if microbatches == 1 else 1e-6), (microbatches, worst)
        assert losses[microbatches] == pytest.approx(whole.loss.item(), rel=1e-6, abs=0)
    assert max(parameter.grad.abs().max().item() for parameter in model.parameters()) > 1e-3


def test_a_pipeline_step_runs_under_bf16_autocast(make_config):
    # The core autocasts on CUDA only; CPU autocast takes the same dtype path: the classifier's bf16 logits
    # once failed torch's stage output check (an H100 run of mixed_precision bf16, one stage).
    from trainer.core import prepared

    with prepared(make_config(strategy="pipeline", dropout=0.0)) as run:
        batch = run._to_device(next(iter(run.train_loader)))
        def bf16():
            return torch.autocast("cpu", dtype=torch.bfloat16)

        loss = run.strategy.forward_backward(batch, run.forward, run.backward, bf16)
        logits = run.strategy.logits(run.eval_model, batch, bf16)
    assert torch.isfinite(loss) and loss.item() > 0
    assert logits.dtype == torch.float32 and logits.shape == (batch["labels"].shape[0], 2)


@pytest.mark.parametrize(("shape", "parameters"), [
    # The shapes of prajjwal1/bert-tiny, -mini, -small, -medium (L2/H128, L4/H256, L4/H512, L8/H512), counted
    # by hand from BERT's layout: embeddings 30522xH + 512xH + 2xH + LayerNorm, per layer 12H^2 + 13H,
    # pooler H^2 + H, the 2-label head 2H + 2.
    ("bert-tiny", 4_386_178), ("bert-mini", 11_171_074), ("bert-small", 28_764_674),
    ("bert-medium", 41_374_210)])
def test_each_generated_model_shape_builds_offline_at_its_published_size(make_config, shape, parameters):
    model = build_model(make_config(model=f"generated:{shape}"))
    assert sum(p.numel() for p in model.parameters()) == parameters
    heads, layers = model.config.num_attention_heads, model.config.num_hidden_layers
    assert model.config.hidden_size // heads == 64  # every miniature BERT has heads of 64
    # Both model-splitting strategies fit 2 workers on every shape (a head each or more, a layer each).
    assert heads % 2 == 0 and layers >= 2


class _GradientSyncingLauncher(TrainHooks):
    framework_label, syncs_gradients = "horovod (test)", True


def test_a_launcher_that_averages_gradients_itself_runs_ddp_alone(make_config):
    with pytest.raises(ConfigError, match="^strategy: zero1 cannot run under horovod \\(test\\), whose "
                                          "optimizer averages every gradient itself; use strategy ddp$"):
        train(make_config(strategy="zero1", epochs=1), _GradientSyncingLauncher())


@pytest.fixture(scope="module")
def unbroken_runs(tmp_path_factory, token_cache):
    """runs(strategy) -> (its 2-worker result, its checkpoint dir, its config): each run once per module."""
    done = {}

    def runs(strategy: str):
        if strategy not in done:
            root = tmp_path_factory.mktemp(strategy)
            cfg = TrainConfig(**{**COMPARED, "strategy": strategy, "output_dir": str(root / "out"),
                                 "cache_dir": str(token_cache),
                                 "checkpoint_dir": str(root / "ckpt")}).validate()
            run(torchrun_command(2, "--config", str(write_config(cfg, root / "run.yml"))))
            done[strategy] = json.loads((root / "out" / "result.json").read_text()), root / "ckpt", cfg
        return done[strategy]
    return runs


def _relative_difference(left: float, right: float) -> float:
    return abs(left - right) / max(abs(right), 1e-12)


@pytest.mark.slow  # two 2-worker runs of 3 epochs: over a minute on 2 busy cores
@pytest.mark.parametrize("strategy", SHARDING)
def test_a_strategy_trains_as_ddp_does(unbroken_runs, strategy):
    ddp_result, ddp_checkpoints, cfg = unbroken_runs(strategy="ddp")
    result, checkpoints, _ = unbroken_runs(strategy)
    metric_tolerance, weight_tolerance = TOLERANCE[strategy]
    assert result["hyperparameters"]["strategy"] == strategy
    # Pipeline's own options as the run used them (the default microbatches: one per stage); none elsewhere.
    pipeline_options = {key: result["hyperparameters"].get(key)
                        for key in ("pipeline_schedule", "microbatches")}
    assert pipeline_options == ({"pipeline_schedule": "1f1b", "microbatches": 2} if strategy == "pipeline"
                                else {"pipeline_schedule": None, "microbatches": None})
    assert "microbatches" not in ddp_result["hyperparameters"]
    assert result["framework_label"] == f"ddp (torchrun) + strategy {strategy}"
    for key in ("train_loss", "val_loss", "val_accuracy"):
        ours, theirs = ([m[key] for m in r["epoch_metrics"]] for r in (result, ddp_result))
        worst = max(_relative_difference(a, b) for a, b in zip(ours, theirs, strict=True))
        assert worst <= metric_tolerance, (key, ours, theirs)
    assert [m["train_samples"] for m in result["epoch_metrics"]] == [cfg.generated_train_size] * 3
    torch.manual_seed(cfg.seed)
    initial = build_model(cfg).state_dict()
    ddp_weights = final_weights(ddp_checkpoints, 3)
    assert max_weight_difference(ddp_weights, initial) > 1e-2  # the runs really moved the weights
    # The one-file checkpoint holds the whole model, as ddp's does, whatever the strategy sharded.
    assert max_weight_difference(final_weights(checkpoints, 3), ddp_weights) <= weight_tolerance


# Over 3 workers (#31: equivalence beyond 2 ranks): the shards are uneven (no parameter count or layer
# splits in three alike) and three gradients are summed, by all-reduce under ddp and zero1 and by
# reduce-scatter under FSDP, in another order. Tensor and pipeline need a head and layer count that 3
# divides, and bert-tiny has 2 of each (bert-mini's 4 over 4 workers would take minutes more on 2 cores).
# Measured on CPU, 3 gloo workers, torch 2.13.0, after 2 epochs: zero1 0.0 in every metric and weight (bit
# for bit); fsdp 1.3e-8 in the losses, 0.0 in accuracy, 9.1e-7 in a weight.
THREE_WORKERS = ("zero1", "fsdp")
THREE_WORKER_TOLERANCE = (1e-6, 1e-5)


def _run_as_three_nodes(config_file: Path) -> None:
    """3 workers as 3 one-process torchrun nodes on loopback: the trainer starts at most one process per
    CPU on a node, and this machine may have 2."""
    port = free_loopback_port()
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=3",
                                f"--node_rank={rank}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                                f"--master_port={port}", "-m", "trainer.launchers.torchrun",
                                "--config", str(config_file)],
                               env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for rank in range(3)]
    outputs = [agent.communicate(timeout=SUBPROCESS_TIMEOUT_S)[0] for agent in agents]
    for agent, output in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, output[-3000:]


@pytest.mark.slow  # three 3-worker runs of 2 epochs on 2 cores
def test_sharding_over_three_workers_trains_as_ddp_does(tmp_path, token_cache):
    results, weights = {}, {}
    for strategy in (strategies.DEFAULT, *THREE_WORKERS):
        root = tmp_path / strategy
        cfg = TrainConfig(**{**COMPARED, "epochs": 2, "strategy": strategy, "output_dir": str(root / "out"),
                             "cache_dir": str(token_cache), "checkpoint_dir": str(root / "ckpt")}).validate()
        _run_as_three_nodes(write_config(cfg, root.with_suffix(".yml")))
        results[strategy] = json.loads((root / "out" / "result.json").read_text())
        weights[strategy] = final_weights(root / "ckpt", 2)
    assert results["ddp"]["world_size"] == 3
    metric_tolerance, weight_tolerance = THREE_WORKER_TOLERANCE
    for strategy in THREE_WORKERS:
        for key in ("train_loss", "val_loss", "val_accuracy"):
            ours, theirs = ([m[key] for m in results[name]["epoch_metrics"]] for name in (strategy, "ddp"))
            worst = max(_relative_difference(a, b) for a, b in zip(ours, theirs, strict=True))
            assert worst <= metric_tolerance, (strategy, key, ours, theirs)
        assert max_weight_difference(weights[strategy], weights["ddp"]) <= weight_tolerance, strategy


# More than one head and one layer per rank (bert-mini: 4 heads and 4 layers over 2 workers), where
# bert-tiny gives each tensor rank 1 head and each pipeline stage 1 layer. Measured on CPU, 2 gloo workers,
# torch 2.13.0, 2 epochs (accuracy 0.50, 0.67): the losses within 3.4e-8 (tensor) and 4.5e-8 (pipeline)
# of ddp's, the accuracy equal.
MORE_PER_RANK = ("tensor", "pipeline")


@pytest.mark.slow  # three 2-worker runs of bert-mini for 2 epochs: about a minute on 2 cores
def test_tensor_and_pipeline_with_two_heads_and_layers_per_rank_train_as_ddp_does(tmp_path, token_cache):
    results = {}
    for strategy in (strategies.DEFAULT, *MORE_PER_RANK):
        root = tmp_path / strategy
        cfg = TrainConfig(**{**COMPARED, "model": "generated:bert-mini", "epochs": 2, "strategy": strategy,
                             "output_dir": str(root / "out"), "cache_dir": str(token_cache)}).validate()
        run(torchrun_command(2, "--config", str(write_config(cfg, root.with_suffix(".yml")))))
        results[strategy] = json.loads((root / "out" / "result.json").read_text())
    assert {r["hyperparameters"]["model"] for r in results.values()} == {"generated:bert-mini"}
    metric_tolerance, _ = TOLERANCE["tensor"]
    for strategy in MORE_PER_RANK:
        for key in ("train_loss", "val_loss", "val_accuracy"):
            ours, theirs = ([m[key] for m in results[name]["epoch_metrics"]] for name in (strategy, "ddp"))
            worst = max(_relative_difference(a, b) for a, b in zip(ours, theirs, strict=True))
            assert worst <= metric_tolerance, (strategy, key, ours, theirs)


@pytest.mark.slow  # two 2-worker runs of 3 epochs: over a minute on 2 busy cores
@pytest.mark.parametrize("strategy", SHARDING)
def test_a_strategy_killed_after_its_first_checkpoint_resumes_to_the_unbroken_result(
        unbroken_runs, strategy, tmp_path):
    unbroken, unbroken_checkpoints, cfg = unbroken_runs(strategy)
    killed = TrainConfig(**{**cfg.as_dict(), "output_dir": str(tmp_path / "out"),
                            "checkpoint_dir": str(tmp_path / "ckpt")})
    command = torchrun_command(2, "--config", str(write_config(killed, tmp_path / "run.yml")))
    kill_after_first_checkpoint(command, tmp_path / "ckpt")
    assert not (tmp_path / "out" / "result.json").exists()

    completed = run(command)
    resumed = json.loads((tmp_path / "out" / "result.json").read_text())
    assert resumed["resumed_from_epoch"] in (1, 2), completed.stdout
    for key in ("train_loss", "val_loss", "val_accuracy", "train_samples"):
        assert [m[key] for m in resumed["epoch_metrics"]] == [m[key] for m in unbroken["epoch_metrics"]], key
    resumed_weights = final_weights(tmp_path / "ckpt", 3)
    assert max_weight_difference(resumed_weights, final_weights(unbroken_checkpoints, 3)) == 0


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
@pytest.mark.parametrize("strategy", SHARDING)
def test_on_one_gpu_a_strategy_stopped_and_resumed_ends_with_ddp_numbers(make_config, tmp_path, strategy):
    # nccl, fp32, deterministic kernels: bit for bit (measured on an H200). zero1's resume once failed only
    # here: ZeroRedundancyOptimizer had put fused AdamW's step on the CPU.
    shared = dict(device="cuda", dropout=0.0, deterministic=True, epochs=3)
    ddp = train(make_config(**shared, output_dir=str(tmp_path / "ddp")))
    resumable = make_config(**shared, strategy=strategy, output_dir=str(tmp_path / "out"),
                            checkpoint_dir=str(tmp_path / "ckpt"))
    assert train(resumable, StopAfter(1)) is None
    resumed = train(resumable)
    assert (resumed["resumed_from_epoch"], resumed["backend"]) == (1, "nccl")
    for key in ("train_loss", "val_loss", "val_accuracy"):
        assert [m[key] for m in resumed["epoch_metrics"]] == [m[key] for m in ddp["epoch_metrics"]], key


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp"])
def test_gradient_accumulations_micro_steps_skip_the_strategys_gradient_sync(make_config, strategy):
    """grad_accum_steps: a micro-step inside gradient_sync_skipped() leaves the gradients local (DDP: no
    bucket reaches the communication hook; FSDP2: no reduce-scatter, so no sharded gradient yet); the step's
    last micro-step, outside it, synchronises them all. In process, one worker."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from trainer.core import prepared

    with prepared(make_config(strategy=strategy, dropout=0.0, grad_accum_steps=2)) as run:
        batches = iter(run.train_loader)
        buckets = []
        if strategy != "fsdp":
            def counting(state, bucket):
                buckets.append(bucket.index())
                return allreduce_hook(state, bucket)
            run.strategy.ddp.register_comm_hook(None, counting)

        def synced() -> bool:
            if strategy == "fsdp":
                return all(parameter.grad is not None for parameter in run.model.parameters())
            return bool(buckets)

        def micro_step():
            batch = run._to_device(next(batches))
            run.strategy.forward_backward(batch, run.forward, run.backward, run._autocast)

        with run.strategy.gradient_sync_skipped():
            micro_step()
        assert not synced()
        micro_step()
        assert synced()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"strategy": "pipeline"},
     "grad_accum_steps: strategy pipeline already splits each step's batch into microbatches (its schedule "
     "accumulates their gradients): raise microbatches or batch_size instead, and leave grad_accum_steps "
     "at 1"),
    ({"sparse_embedding_sync": True}, "grad_accum_steps: not measured or tested together with "
                                      "sparse_embedding_sync (which all-reduces the word embeddings' rows "
                                      "itself); set one of them off"),
])
def test_gradient_accumulation_is_refused_in_one_line_where_it_cannot_run(make_config, overrides, message):
    with pytest.raises(ConfigError) as refused:
        make_config(grad_accum_steps=2, **overrides)
    assert str(refused.value) == message
    assert config_hash(TrainConfig(grad_accum_steps=1)) == config_hash(TrainConfig())
    assert config_hash(TrainConfig(grad_accum_steps=2)) != config_hash(TrainConfig())


@pytest.mark.slow  # four in-process trainings: over 10 s on 2 cores
def test_gradient_compression_hooks_send_what_they_say_and_move_the_weights_only_slightly(make_config,
                                                                                          tmp_path):
    """grad_compression on DDP's all-reduce (one worker in process, so every difference is the hook's): fp16
    and bf16 send half of the fp32 gradients' bytes and round them; PowerSGD (rank 1) sends its two warm-up
    steps whole and then the low-rank factors, far fewer bytes; each ends near the uncompressed weights."""
    results, weights = {}, {}
    for compression in ("none", "fp16", "bf16", "powersgd"):
        cfg = make_config(optimizer="sgd", learning_rate=0.5, warmup_steps=0, dropout=0.0, epochs=1,
                          grad_compression=compression, output_dir=str(tmp_path / compression),
                          checkpoint_dir=str(tmp_path / f"c-{compression}"))
        train(cfg)
        results[compression] = json.loads((tmp_path / compression / "result.json").read_text())
        weights[compression] = final_weights(tmp_path / f"c-{compression}", 1)
    for compression, result in results.items():
        validate_result(result)
        assert result["gradient_sync"]["compression"] == compression
    plain = results["none"]["gradient_sync"]
    torch.manual_seed(cfg.seed)
    initial = build_model(cfg)
    parameters = sum(p.numel() for p in initial.parameters())
    # Measured (CPU, torch 2.13, SGD at 0.5, 1 epoch): the plain weights moved up to 0.46 from their start;
    # fp16 ended 0.08 from them, bf16 0.13, PowerSGD 0.09; the validation losses within 0.001.
    moved = max_weight_difference(weights["none"], initial.state_dict())
    assert plain == {"compression": "none", "bytes_per_step": parameters * 4,
                     "counted": "every trainable gradient"}
    for half in ("fp16", "bf16"):
        assert results[half]["gradient_sync"]["bytes_per_step"] == parameters * 2
        assert results[half]["framework_label"] == f"ddp (torchrun) + {half} gradient compression"
        assert 0 < max_weight_difference(weights[half], weights["none"]) < moved / 3
    powersgd = results["powersgd"]["gradient_sync"]["bytes_per_step"]
    assert powersgd < parameters * 4 / 3, powersgd
    assert results["powersgd"]["hyperparameters"]["grad_compression"] == "powersgd"
    assert 0 < max_weight_difference(weights["powersgd"], weights["none"]) < moved / 3
    for result in results.values():
        assert result["epoch_metrics"][-1]["val_loss"] == pytest.approx(
            results["none"]["epoch_metrics"][-1]["val_loss"], abs=0.01)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"strategy": "fsdp", "grad_compression": "fp16"},
     "grad_compression: a DDP communication hook, which strategy fsdp has no use for or cannot take; use it "
     "with ddp or zero1"),
    ({"grad_compression": "fp16", "sparse_embedding_sync": True},
     "grad_compression: not measured or tested together with sparse_embedding_sync (which all-reduces the "
     "word embeddings' rows itself); set one of them off"),
    ({"grad_compression": "fp16", "powersgd_rank": 4},
     "powersgd_rank: an option of grad_compression powersgd, not of fp16; leave it unset"),
])
def test_gradient_compression_is_refused_in_one_line_where_it_cannot_run(make_config, overrides, message):
    with pytest.raises(ConfigError) as refused:
        make_config(**overrides)
    assert str(refused.value) == message


def test_powersgd_on_gloo_keeps_one_bucket_and_ddps_own_buckets_stay_otherwise(make_config):
    """PowerSGD's callbacks wait on Gloo's two worker threads, so two buckets can deadlock a step
    (trainer.strategies.ddp.powersgd_on_gloo): under it DDP keeps one bucket, also after the rebuild at its
    first step; without it DDP's own buckets (a 1 MiB first one) stay."""
    from trainer.distributed import process_group

    device, buckets = torch.device("cpu"), {}
    with process_group(device):
        for compression in ("powersgd", "none"):
            cfg = make_config(grad_compression=compression)
            hooks = TrainHooks()
            hooks.cfg = cfg
            torch.manual_seed(0)
            ddp = strategies.load(strategies.DEFAULT, device, 0, 1).wrap_model(build_model(cfg), hooks)
            for _ in range(3):  # DDP rebuilds its buckets in the order the first backward filled them
                ids = torch.randint(5, 100, (4, 16))
                ddp(input_ids=ids, labels=torch.zeros(4, dtype=torch.long)).loss.backward()
            logged = ddp._get_ddp_logging_data()
            assert logged["has_rebuilt_buckets"] == 1, compression
            buckets[compression] = str(logged["rebuilt_bucket_sizes"]).split(", ")
    assert len(buckets["powersgd"]) == 1 and len(buckets["none"]) > 1, buckets
