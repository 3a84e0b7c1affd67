"""Where a step's time goes (profile_steps): torch.profiler over a few steady optimizer steps of the first
epoch a process trains, on every rank, summed into what the report compares across platforms and strategies.

The core marks its phases with record_function (dtlab.data, dtlab.forward_backward, dtlab.optimizer) only
while the profiler records: an unprofiled run's loop is untouched. The collectives' own spans (gloo:*,
nccl:*: the all-reduce of DDP's buckets, Horovod's, the sharded strategies' gathers) run beside backward,
so they overlap forward_backward's time rather than add to it; the summary says each as measured."""

from __future__ import annotations

import contextlib
import resource

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PHASES = ("data", "forward_backward", "optimizer")
COLLECTIVE_PREFIXES = ("gloo:", "nccl:")
TOP_OPERATORS = 5


class StepProfiler:
    """Profiles optimizer steps skip+1 .. skip+steps of this process's first epoch (steps 0: never)."""

    def __init__(self, steps: int, skip: int, is_cuda: bool):
        self.steps, self.skip, self.is_cuda = steps, skip, is_cuda
        self.profile: profile | None = None
        self.result: dict | None = None

    @property
    def recording(self) -> bool:
        return self.profile is not None

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        return record_function(f"dtlab.{name}") if self.recording else contextlib.nullcontext()

    def step_done(self, optimizer_steps: int) -> None:
        """After each optimizer step (the count so far in this process): start or stop the window."""
        if self.steps == 0 or self.result is not None:
            return
        if optimizer_steps == self.skip and not self.recording:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.is_cuda else [])
            if self.is_cuda:  # CUDA-only: the window's own peak
                torch.cuda.reset_peak_memory_stats()
            self.profile = profile(activities=activities)
            self.profile.start()
        elif optimizer_steps == self.skip + self.steps and self.recording:
            self.profile.stop()
            self.result = self._summary(self.profile)
            self.profile = None

    def stop(self) -> None:
        """An epoch ended inside the window: summarise the steps it holds."""
        if self.recording:
            self.step_done(self.skip + self.steps)

    def _summary(self, finished: profile) -> dict:
        events = finished.key_averages()

        def per_step(microseconds: float) -> float:  # over the window -> milliseconds per step
            return microseconds / 1000.0 / self.steps

        def total(key: str) -> float:
            return per_step(sum(event.cpu_time_total for event in events if event.key == key))

        phases = {f"{name}_ms": total(f"dtlab.{name}") for name in PHASES}
        collectives = [event for event in events if event.key.startswith(COLLECTIVE_PREFIXES)]
        operators = [event for event in events
                     if not event.key.startswith(("dtlab.", *COLLECTIVE_PREFIXES, "ProfilerStep"))]
        own_time = "self_device_time_total" if self.is_cuda else "self_cpu_time_total"
        top = sorted(operators, key=lambda event: getattr(event, own_time), reverse=True)[:TOP_OPERATORS]
        return {
            **phases,
            "collectives_ms": per_step(sum(event.cpu_time_total for event in collectives)),
            "top_operators": [{"name": event.key, "ms_per_step": per_step(getattr(event, own_time)),
                               "calls_per_step": event.count / self.steps} for event in top],
            # CUDA: the window's allocated peak; CPU: the process's resident peak so far (no allocator stats)
            "peak_memory_mb": (torch.cuda.max_memory_allocated() / 2**20 if self.is_cuda
                               else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "operator_time": "CUDA kernels' own time" if self.is_cuda else "CPU time on the rank's threads",
        }
