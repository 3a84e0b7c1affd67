"""The one training core: the study's protocol, run the same way under every launcher.

    result = train(cfg)            # inside torchrun / TorchDistributor / Determined, or alone

Protocol (study §4.2-4.3): BertForSequenceClassification (2 labels), AdamW, linear warmup then
linear decay to 0 over the run, batch per worker, DistributedSampler with set_epoch, DDP
gradient averaging (or another parallelism strategy: trainer/strategies/), validation on the test
split after every epoch with loss / correct / count all-reduced with SUM, and the run timed with
time.perf_counter from the start of training to the end of the last validation.
"""

from __future__ import annotations

import contextlib
import os
import random
import time

import numpy as np
import psutil
import torch
import torch.distributed as dist

from trainer import flops, progress, result, run_checkpoint, strategies
from trainer.batches import LengthGroupedBatchSampler, PaddedBatches, padding_multiple, validation_batches
from trainer.config import DDP_OPTIONS, ConfigError, TrainConfig, config_hash
from trainer.distributed import all_reduce_sum, average_touched_rows, gather, process_group, resolve_device
from trainer.energy import EnergyMeter
from trainer.hooks import TrainHooks
from trainer.model import build_model, compiled
from trainer.step_profile import StepProfiler

_PRECISION_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}  # result.json's names
_GPU_UTILIZATION_EVERY_STEPS = 20  # an NVML query per step would cost more than it tells


def auto_precision(capability: tuple[int, int]) -> str:
    """What mixed_precision: auto picks on a GPU of this compute capability: bf16, fp16 or no.

    bf16 only where the tensor cores have it (8.0, Ampere, and newer); torch.cuda.is_bf16_supported()
    also counts emulation, which is slower than fp32. fp16 with a GradScaler on Volta and Turing (7.x),
    whose tensor cores are fp16-only. fp32 below: Pascal consumer cards such as the study's GTX 1060
    (6.1) run fp16 arithmetic at a small fraction of their fp32 rate.
    """
    if capability >= (8, 0):
        return "bf16"
    if capability >= (7, 0):
        return "fp16"
    return "no"


def train(cfg: TrainConfig, hooks: TrainHooks | None = None) -> dict | None:
    """Run the protocol on this process's rank; rank 0 writes <output_dir>/result.json and returns it."""
    with prepared(cfg, hooks) as run:
        return run.run()


@contextlib.contextmanager
def prepared(cfg: TrainConfig, hooks: TrainHooks | None = None):
    """A process group, device, data, model and optimizer ready to train: what train() runs, and
    what benchmarks/gpu_trainer.py times phase by phase."""
    process_started = psutil.Process().create_time()  # launch-to-first-step includes imports
    # Between the two: the imports, and under Ray what Ray Train does in this process (its worker, the
    # process group) before it calls train() (benchmarks/launcher_overhead.py splits the launch there).
    core_entered = time.time()
    cfg.validate()
    hooks = hooks or TrainHooks()
    hooks.cfg = cfg
    torch.set_num_threads(cfg.threads)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if cfg.deterministic:
        # cuBLAS reads this when its first handle is made; set before any CUDA work in this process.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    # CUDA-only in effect: cuDNN's attention, torch's first choice for bf16 on Hopper GPUs, builds an
    # execution plan per input shape, and dynamic padding gives most batches a new width. On an H100 a
    # bert-medium bf16 step took 136.6 ms with it and 38.5 ms without (benchmarks/README.md, Strategies).
    # Flash and memory-efficient attention take any width.
    had_cudnn_attention = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:  # both settings are given back however the run ends, a refused device or world size included
        device = resolve_device(cfg)
        with process_group(device):
            run = _Run(cfg, hooks, device, process_started, core_entered)
            run.build()
            yield run
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.backends.cuda.enable_cudnn_sdp(had_cudnn_attention)


# --- one run ---------------------------------------------------------------------------------------

def _refuse_what_a_syncing_optimizer_cannot_run(cfg: TrainConfig, hooks: TrainHooks, strategy) -> None:
    """A launcher whose optimizer averages every gradient itself (Horovod's) runs no other strategy and
    none of DDP's own options: each is refused in one line, before training."""
    if not strategy.runs_under_gradient_syncing_launcher:
        raise ConfigError(f"strategy: {cfg.strategy} cannot run under {hooks.framework_label}, whose "
                          f"optimizer averages every gradient itself; use strategy {strategies.DEFAULT}")
    if cfg.grad_compression not in hooks.gradient_compressions:
        raise ConfigError(f"grad_compression: {cfg.grad_compression} is a DDP communication hook; "
                          f"{hooks.framework_label} compresses with "
                          f"{' or '.join(hooks.gradient_compressions)} only")
    for key in DDP_OPTIONS:
        if getattr(cfg, key):
            raise ConfigError(f"{key}: a DDP optimisation; {hooks.framework_label} "
                              "averages every gradient itself: set it to false")


def _optimizer(cfg: TrainConfig, model: torch.nn.Module, strategy) -> torch.optim.Optimizer:
    # As in Hugging Face's examples: no weight decay on biases and LayerNorm weights.
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    build = strategy.build_optimizer  # a strategy may shard the optimizer's state (ZeRO)
    if cfg.optimizer == "sgd":
        return build(torch.optim.SGD, groups, lr=cfg.learning_rate)
    try:  # the fused kernel: one pass over the weights instead of many (16x faster on one CPU core)
        return build(torch.optim.AdamW, groups, lr=cfg.learning_rate, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without a fused kernel
        return build(torch.optim.AdamW, groups, lr=cfg.learning_rate)


class _Run:
    def __init__(self, cfg: TrainConfig, hooks: TrainHooks, device: torch.device, process_started: float,
                 core_entered: float):
        self.cfg, self.hooks, self.device = cfg, hooks, device
        self.process_started, self.core_entered = process_started, core_entered
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_cuda = device.type == "cuda"
        self.config_hash = config_hash(cfg)
        if cfg.output_dir:
            progress.mark_rank(cfg.output_dir, self.rank)

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"{progress.LOG_PREFIX}{message}", flush=True)

    # --- setup ---
    def _seed(self) -> None:
        random.seed(self.cfg.seed)
        np.random.seed(self.cfg.seed)
        torch.manual_seed(self.cfg.seed)  # also seeds CUDA; every rank builds the same initial weights

    def build(self) -> None:
        cfg = self.cfg
        if cfg.data_path not in self.hooks.data_paths:
            raise ConfigError(f"data_path: {cfg.data_path} is Spark's and Ray's own ETL; "
                              f"{self.hooks.framework_label} reads through the DataLoader: use loader")
        data_started = time.time()
        splits = self.hooks.tokenized_splits(self.log)
        self.data_marks = {**(self.hooks.data_marks or {}), "data_started": data_started,
                           "data_ready": time.time()}
        self._seed()
        model = build_model(cfg).to(self.device)
        self.model = model
        self.word_embeddings = None
        self.strategy = strategies.load(cfg.strategy, self.device, self.rank, self.world_size)
        if self.hooks.syncs_gradients:
            _refuse_what_a_syncing_optimizer_cannot_run(cfg, self.hooks, self.strategy)
        ddp = torch.nn.parallel.DistributedDataParallel
        if cfg.sparse_embedding_sync and self.world_size > 1:
            # dtlab's opt-in optimisation, not stock DDP: the word-embedding gradient (90% of bert-tiny's)
            # is zero outside the batch's tokens, so we average only those rows ourselves
            # (distributed.average_touched_rows) and DDP the rest. Needs a private torch API. Strategy ddp
            # only (the config refuses the others).
            self.word_embeddings = model.get_input_embeddings().weight
            name = next(n for n, p in model.named_parameters() if p is self.word_embeddings)
            ddp._set_params_and_buffers_to_ignore_for_model(model, [name])
        self.parallel_model = self.strategy.wrap_model(model, self.hooks)
        self.eval_model = self.strategy.eval_model
        if cfg.compile != "no":
            self.parallel_model, self.eval_model = compiled(cfg.compile, self.parallel_model, self.eval_model)

        num_workers = cfg.num_workers if cfg.num_workers is not None else (2 if self.is_cuda else 0)
        # Loader workers draw their base seed from this generator, not the global RNG, so a resumed
        # run's dropout stream is the unbroken run's (persistent workers draw it once per run).
        loader_options = dict(batch_size=None, num_workers=num_workers, pin_memory=self.is_cuda,
                              persistent_workers=num_workers > 0,
                              generator=torch.Generator().manual_seed(cfg.seed))
        self.pad_multiple = pad_multiple = padding_multiple(cfg, self.is_cuda)
        train_split, test_split = splits["train"], splits["test"]
        # The data is cut into the strategy's data-parallel shares, not per rank: ranks that split the
        # model between them (tensor parallelism) see the same batches. The global batch stays
        # batch_size x world size whatever the strategy, so strategies compare at the same batch.
        shares, share = self.strategy.data_parallel_size, self.strategy.data_parallel_rank
        share_batch_size = cfg.batch_size * self.world_size // shares
        # Each share's sums count once in the global metrics: on the lowest rank that sees it and holds
        # its loss and logits (a pipeline's last stage).
        holders = gather(share if self.strategy.reports_metrics else None)
        self.counts_its_share = holders.index(share) == self.rank
        sampler = torch.utils.data.DistributedSampler(
            train_split, num_replicas=shares, rank=share, shuffle=True, seed=cfg.seed)
        self.batch_sampler = LengthGroupedBatchSampler(sampler, train_split.lengths, share_batch_size,
                                                       cfg.seed, group_by_length=cfg.group_by_length)
        self.train_loader = torch.utils.data.DataLoader(
            PaddedBatches(train_split, pad_to_multiple_of=pad_multiple),
            sampler=self.batch_sampler, **loader_options)
        self.val_loader = torch.utils.data.DataLoader(
            PaddedBatches(test_split, pad_to_multiple_of=pad_multiple),
            sampler=validation_batches(test_split.lengths, share, shares, share_batch_size),
            **loader_options)
        # Forwards a rank runs after its own validation batches, to join the others' weight gathers.
        self.joining_val_forwards = 0
        if self.strategy.collective_evaluation:
            self.joining_val_forwards = max(gather(len(self.val_loader))) - len(self.val_loader)
        self.train_size, self.test_size = len(train_split), len(test_split)
        # The whole model's FLOPs, however a strategy splits it: MFU's numerator
        self.model_flops_per_epoch = flops.training_flops(flops.EncoderShape.of(model.config),
                                                          np.diff(train_split.offsets))
        self.data_fingerprint = train_split.fingerprint  # the tokens every rank trains on

        # An optimizer step every grad_accum_steps micro-batches; an epoch's last step takes what is left.
        self.micro_batches_per_epoch = len(self.batch_sampler)
        self.steps_per_epoch = -(-self.micro_batches_per_epoch // cfg.grad_accum_steps)
        self.micro_steps = 1  # of the optimizer step in progress: each micro-batch's loss counts 1/N
        self.profiler = StepProfiler(cfg.profile_steps, result.STEADY_STATE_SKIP_STEPS, self.is_cuda)
        self.optimizer = self.hooks.wrap_optimizer(_optimizer(cfg, model, self.strategy), model)
        from transformers import get_linear_schedule_with_warmup

        self.scheduler = get_linear_schedule_with_warmup(
            self.optimizer, cfg.warmup_steps, cfg.epochs * self.steps_per_epoch)
        self.autocast_dtype = self._autocast_dtype()
        # CUDA-only: fp16 needs loss scaling; bf16 and fp32 do not.
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.autocast_dtype == torch.float16)
        if self.scaler.is_enabled() and not self.strategy.supports_loss_scaling:
            raise ConfigError(f"mixed_precision: fp16 needs loss scaling, which strategy {cfg.strategy} "
                              "cannot do (its ranks would skip different steps); use bf16 or no")

    def _autocast_dtype(self) -> torch.dtype | None:
        if not self.is_cuda:
            return None
        choice = self.cfg.mixed_precision
        if choice == "auto":  # CUDA-only: by what the GPU's tensor cores do natively
            choice = auto_precision(torch.cuda.get_device_capability(self.device))
        return {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}[choice]

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=self.autocast_dtype)

    # --- the loop ---
    def _to_device(self, batch: dict) -> dict:
        return {key: value.to(self.device, non_blocking=True) for key, value in batch.items()}

    def _sample_gpu_utilization(self) -> None:
        """CUDA-only: NVML's utilization of this rank's GPU (nvidia-ml-py, a trainer dependency)."""
        with contextlib.suppress(Exception):  # NVML's library (the driver's) unloadable: leave it null
            self.gpu_utilization.append(float(torch.cuda.utilization(self.device)))

    def _synchronize(self) -> None:
        if self.is_cuda:  # CUDA-only: wait for queued kernels before reading the clock
            torch.cuda.synchronize(self.device)

    def forward(self, batch: dict) -> torch.Tensor:
        with self._autocast():
            return self.parallel_model(**batch).loss

    def backward(self, loss: torch.Tensor, batch: dict) -> None:
        # Accumulated over micro_steps micro-batches of one size, the gradient is the whole step's mean.
        self.scaler.scale(loss / self.micro_steps if self.micro_steps > 1 else loss).backward()
        if self.word_embeddings is not None:  # sparse_embedding_sync
            average_touched_rows(self.word_embeddings.grad, batch["input_ids"], self.world_size)

    def optimizer_step(self) -> None:
        self.hooks.optimizer_step(self.scaler, self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad()  # set_to_none, torch's default; Horovod's optimizer takes no argument

    def _sum_over_shares(self, values: list[float]) -> list[float]:
        """Each value summed over the data-parallel shares (a share several ranks see, once)."""
        return all_reduce_sum(values if self.counts_its_share else [0.0] * len(values), self.device)

    def _train_epoch(self, epoch: int) -> dict:
        self.batch_sampler.set_epoch(epoch)
        self.parallel_model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        samples = 0
        started, cpu_started = time.perf_counter(), time.process_time()
        accumulate, micro_batches = self.cfg.grad_accum_steps, self.micro_batches_per_epoch
        phase = self.profiler.phase  # record_function while profiling (profile_steps), else nothing
        batches = iter(self.train_loader)
        for index in range(micro_batches):
            with phase("data"):
                batch = self._to_device(next(batches))
            first = index % accumulate
            if first == 0:  # a new optimizer step: its micro-batches, and its clock
                self.micro_steps = min(accumulate, micro_batches - index)
                step_started = time.perf_counter()
            last = first == self.micro_steps - 1
            # Gradients sync on a step's last micro-batch only (one all-reduce per optimizer step).
            with contextlib.nullcontext() if last else self.strategy.gradient_sync_skipped(), \
                    phase("forward_backward"):
                loss = self.strategy.forward_backward(batch, self.forward, self.backward, self._autocast)
            size = batch["labels"].shape[0]
            loss_sum += loss.detach().double() * size  # stays on the device: no sync per step
            samples += size
            if not last:
                continue
            with phase("optimizer"):
                self.optimizer_step()
            self.step_times.append(time.perf_counter() - step_started)
            self.profiler.step_done(len(self.step_times))
            if self.is_cuda and len(self.step_times) % _GPU_UTILIZATION_EVERY_STEPS == 0:
                self._sample_gpu_utilization()
            if self.first_step_done_at is None:
                self.first_step_done_at = time.time()
        self.profiler.stop()  # an epoch shorter than the window: what it profiled
        global_loss, global_samples = self._sum_over_shares([loss_sum.item(), samples])
        self._synchronize()
        return {"train_time_s": time.perf_counter() - started, "train_samples": int(global_samples),
                "train_loss": global_loss / max(global_samples, 1),
                "train_cpu_time_s": time.process_time() - cpu_started}

    @torch.inference_mode()
    def _validate(self) -> dict:
        self.eval_model.eval()
        started = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        count = 0
        for batch in self.val_loader:
            batch = self._to_device(batch)
            logits = self.strategy.logits(self.eval_model, batch, self._autocast)
            if logits is None:  # a rank without the logits (a pipeline's earlier stage): nothing to count
                continue
            logits = logits.float()
            loss_sum += torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="sum").double()
            correct += (logits.argmax(dim=-1) == batch["labels"]).sum()
            count += batch["labels"].shape[0]
        for _ in range(self.joining_val_forwards):  # a one-row dummy batch; its logits are not counted
            joining = torch.ones((1, self.pad_multiple), dtype=torch.long, device=self.device)
            with self._autocast():
                self.eval_model(input_ids=joining, attention_mask=joining)
        total_loss, total_correct, total_count = self._sum_over_shares(
            [loss_sum.item(), float(correct.item()), count])
        self._synchronize()
        return {"val_time_s": time.perf_counter() - started, "val_loss": total_loss / total_count,
                "val_accuracy": total_correct / total_count}

    def run(self) -> dict | None:
        cfg = self.cfg
        start_epoch, elapsed_before, epoch_metrics = run_checkpoint.resume(self)
        resumed_from = start_epoch if start_epoch > 0 else None
        self.step_times, self.first_step_done_at, self.gpu_utilization = [], None, []
        self.training_ended_at = None
        self.log(f"{self.hooks.framework_label}: world size {self.world_size} on {self.device}, "
                 f"{self.train_size} train / {self.test_size} test reviews, "
                 f"{self.steps_per_epoch} steps/epoch"
                 f"{f' of {cfg.grad_accum_steps} micro-batches' if cfg.grad_accum_steps > 1 else ''}, "
                 f"{progress.epoch_range(start_epoch + 1, cfg.epochs)}")
        dist.barrier()  # all ranks start the timed span together
        training_started_at = time.time()
        span_started = time.perf_counter()
        meter = EnergyMeter(self.device)
        meter.start()
        try:
            finished = self._epochs(start_epoch, epoch_metrics, elapsed_before, span_started)
        finally:
            self.energy = meter.stop()
        if finished is None:
            return None
        return self._result(finished, epoch_metrics, resumed_from, training_started_at)

    def _epochs(self, start_epoch: int, epoch_metrics: list[dict], elapsed_before: float,
                span_started: float) -> float | None:
        """Train and validate each epoch left: the study's span in seconds, or None when asked to stop."""
        cfg = self.cfg
        elapsed = elapsed_before
        for epoch in range(start_epoch, cfg.epochs):
            metrics = {"epoch": epoch + 1, **self._train_epoch(epoch), **self._validate()}
            epoch_metrics.append(metrics)
            elapsed = elapsed_before + time.perf_counter() - span_started  # the study's span ends here
            self.training_ended_at = time.time()
            self.log(f"{progress.epoch_done(epoch + 1, cfg.epochs)}train {metrics['train_time_s']:.2f}s "
                     f"loss {metrics['train_loss']:.4f} | val {metrics['val_time_s']:.2f}s "
                     f"loss {metrics['val_loss']:.4f} accuracy {metrics['val_accuracy']:.4f}")
            if self.rank == 0:
                self.hooks.on_epoch_end(epoch + 1, dict(metrics))
            run_checkpoint.save(self, epoch + 1, elapsed, epoch_metrics)
            stop = all_reduce_sum([float(self.hooks.should_stop())], self.device)[0] > 0
            if stop and epoch + 1 < cfg.epochs:
                self.log(f"stopping after epoch {epoch + 1} as the launcher asked (a preemption, or a "
                         "search's early stopping); a resumed run continues from here")
                return None
        return elapsed

    def _gradient_sync(self) -> dict | None:
        """What rank 0's gradient all-reduce sent per optimizer step of this process's span, and how."""
        sync = (self.hooks.gradient_sync(self.model) if self.hooks.syncs_gradients
                else self.strategy.gradient_sync(len(self.step_times)))
        return None if sync is None else {"compression": self.cfg.grad_compression, **sync}

    def _result(self, time_total: float, epoch_metrics: list[dict], resumed_from: int | None,
                training_started_at: float) -> dict | None:
        cuda_mb = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.is_cuda else None
        per_rank = gather(result.rank_summary(cuda_mb, self.energy, self.profiler.result))  # every rank
        if self.rank != 0:
            return None
        # MFU's denominator: a GPU's is declared per model (the report's); a CPU's is measured here, after
        # the timed span, on rank 0's threads.
        peak, source = (None, "declared per GPU model") if self.is_cuda else flops.measured_cpu_peak()
        run_result = result.assemble(
            self.cfg, launcher_framework=self.hooks.framework, launcher_label=self.hooks.framework_label,
            world_size=self.world_size, device_type=self.device.type, backend=dist.get_backend(),
            config_hash=self.config_hash, data_fingerprint=self.data_fingerprint,
            mixed_precision=_PRECISION_NAMES.get(self.autocast_dtype, "no"), pad_multiple=self.pad_multiple,
            time_total=time_total, epoch_metrics=epoch_metrics, step_times=self.step_times,
            gpu_utilization=self.gpu_utilization, per_rank=per_rank, resumed_from=resumed_from,
            model_flops_per_epoch=self.model_flops_per_epoch,
            device_peak={"flops_per_s": peak, "source": source},
            gradient_sync=self._gradient_sync(),
            timeline_unix={"process_started": self.process_started, "core_entered": self.core_entered,
                           "training_started": training_started_at,
                           "first_step_done": self.first_step_done_at,
                           "training_ended": self.training_ended_at, **self.data_marks})
        path = result.write_result(run_result, self.cfg.output_dir)
        self.log(f"final accuracy {run_result['final_accuracy']:.4f} in {time_total:.2f}s; wrote {path}")
        return run_result
