"""Part 2 of benchmarks/gpu_trainer.py, the ceiling: one variant's step as the trainer runs it, split
into its phases, and the GPU's kernel time per step; and the synchronisation both parts' clocks use."""

from __future__ import annotations

import time


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure_ceiling(cfg, fused: bool, ceiling_steps: int) -> dict:
    """One ceiling variant's figures, for its config (fused: the fused AdamW kernels, as the trainer has
    them; else the multi-tensor ones) over at most ceiling_steps steps per measurement."""
    import torch

    from trainer.core import prepared

    with prepared(cfg) as run:
        if not fused:  # the same parameter groups and schedule, with the multi-tensor (foreach) kernels
            from transformers import get_linear_schedule_with_warmup

            run.optimizer = torch.optim.AdamW(run.optimizer.param_groups, lr=cfg.learning_rate, foreach=True)
            run.scheduler = get_linear_schedule_with_warmup(
                run.optimizer, cfg.warmup_steps, cfg.epochs * run.steps_per_epoch
            )
        run.parallel_model.train()

        def step(batch):
            batch = run._to_device(batch)
            run.backward(run.forward(batch), batch)
            run.optimizer_step()

        run.batch_sampler.set_epoch(0)
        for batch in run.train_loader:  # warm-up epoch: every width compiled and captured, caches warm
            step(batch)
        run.batch_sampler.set_epoch(1)
        batches = iter(run.train_loader)
        measured = min(ceiling_steps, (run.steps_per_epoch - 2) // 3)
        synchronize()
        started = time.perf_counter()
        for _ in range(measured):
            step(next(batches))
        synchronize()
        step_s = (time.perf_counter() - started) / measured

        phases = {"data": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        for _ in range(measured):
            marks = [time.perf_counter()]
            batch = run._to_device(next(batches))
            synchronize()
            marks.append(time.perf_counter())
            loss = run.forward(batch)
            synchronize()
            marks.append(time.perf_counter())
            run.backward(loss, batch)
            synchronize()
            marks.append(time.perf_counter())
            run.optimizer_step()
            synchronize()
            marks.append(time.perf_counter())
            for name, begin, end in zip(phases, marks, marks[1:], strict=False):
                phases[name] += end - begin

        kernel_s = None
        if run.is_cuda:
            activities = [torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as profile:
                for _ in range(measured):
                    step(next(batches))
                synchronize()
            kernel_s = sum(event.self_device_time_total for event in profile.key_averages()) / 1e6 / measured
    return {
        "step_ms": step_s * 1e3,
        "phases_ms": {name: seconds * 1e3 / measured for name, seconds in phases.items()},
        "kernel_ms": kernel_s * 1e3 if kernel_s is not None else None,
        "steps": measured,
    }
