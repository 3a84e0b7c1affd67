"""One rank of a benchmarks/strategies.py run: the torchrun launcher's training, plus two figures the
trainer does not record. Run under torchrun with the launcher's flags (`--config FILE`).

- **Bytes sent per step.** torch's profiler records every c10d operation the strategies issue (DDP's
  bucket all-reduces from C++, FSDP's gathers and reduce-scatters, DTensor's collectives, ZeRO's
  broadcasts, the pipeline's sends) with its tensors' shapes. Over PROFILED_STEPS training steps after
  PROFILE_AFTER_STEPS, each is converted to the bytes this rank puts on the wire under ring algorithms,
  as nccl-tests counts bus bytes: all-reduce 2(n-1)/n of the tensor, all-gather and reduce-scatter
  (n-1)/n of the whole tensor, broadcast (n-1)/n averaged over ranks, a send all of it.
- **The pipeline's idle fraction.** The time each stage spends in its own forward and backward chunks
  (torch.distributed.pipelining's forward_one_chunk and backward_one_chunk), against the span of the
  step's forward and backward; the rest is the bubble plus the sends and receives.

Each rank writes probe-rank<N>.json beside result.json.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.distributed.pipelining import stage as pipelining_stage  # noqa: E402

from trainer.core import TrainHooks, train  # noqa: E402
from trainer.options import parse_args  # noqa: E402
from trainer.result import STEADY_STATE_SKIP_STEPS  # noqa: E402
from trainer.strategies.pipeline import PipelineParallel  # noqa: E402

PROFILE_AFTER_STEPS = 6  # past the first steps' allocations, inside the steady state result.json times
PROFILED_STEPS = 3
# Element sizes of the profiler's type names; a tensor list's type is not recorded (benchmarks run fp32).
_ELEMENT_BYTES = {"float": 4, "double": 8, "long int": 8, "int": 4, "c10::BFloat16": 2, "c10::Half": 2,
                  "unsigned char": 1, "bool": 1, "signed char": 1}
_LIST_ELEMENT_BYTES = 4
# c10d operation -> (which argument's size counts, the share of it one rank sends with n ranks)
_SENT_SHARE = {
    "c10d::allreduce_": (0, lambda n: 2 * (n - 1) / n),
    "c10d::allreduce_coalesced_": (0, lambda n: 2 * (n - 1) / n),
    "c10d::broadcast_": (0, lambda n: (n - 1) / n),
    "c10d::allgather_": (0, lambda n: (n - 1) / n),
    "c10d::_allgather_base_": (0, lambda n: (n - 1) / n),
    "c10d::allgather_into_tensor_coalesced_": (0, lambda n: (n - 1) / n),
    "c10d::reduce_scatter_": (1, lambda n: (n - 1) / n),
    "c10d::_reduce_scatter_base_": (1, lambda n: (n - 1) / n),
    "c10d::reduce_scatter_tensor_coalesced_": (1, lambda n: (n - 1) / n),
    "c10d::send": (0, lambda n: 1.0),
    "c10d::recv_": (0, lambda n: 0.0),
    "c10d::recv_any_source_": (0, lambda n: 0.0),
    "c10d::barrier": (0, lambda n: 0.0),
}


def _elements(dims) -> int:
    """Elements in a profiler 'Input Dims' entry: one tensor's shape, or a (nested) list of shapes."""
    if not dims:
        return 0
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    return sum(_elements(d) for d in dims)


def sent_bytes(events: list[dict], world_size: int) -> tuple[float, dict[str, int], list[str]]:
    """(bytes this rank sent, calls per operation, operations not understood) of a chrome trace's events."""
    total, calls, unknown = 0.0, {}, []
    for event in events:
        name = event.get("name", "")
        if not name.startswith("c10d::"):
            continue
        calls[name] = calls.get(name, 0) + 1
        if name not in _SENT_SHARE:
            unknown.append(name)
            continue
        args = event.get("args", {})
        index, share = _SENT_SHARE[name]
        dims, types = args.get("Input Dims", []), args.get("Input type", [])
        if index >= len(dims):
            unknown.append(name)
            continue
        size = _ELEMENT_BYTES.get(types[index] if index < len(types) else "", _LIST_ELEMENT_BYTES)
        total += _elements(dims[index]) * size * share(world_size)
    return total, calls, sorted(set(unknown))


class StageClock:
    """Seconds a pipeline stage spends computing its chunks (busy), and the span of the forward and
    backward of the steps they fall in, counted once the steady state has begun."""

    def __init__(self, device: torch.device):
        self.device, self.counting = device, False
        self.seconds = {"busy": 0.0, "span": 0.0}

    def _now(self) -> float:
        if self.device.type == "cuda":  # CUDA-only: the chunk's kernels end before the clock is read
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def timed(self, method, into: str):
        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            started = self._now()
            try:
                return method(*args, **kwargs)
            finally:
                if self.counting:
                    self.seconds[into] += self._now() - started
        return wrapper


class ProbeHooks(TrainHooks):
    framework_label = "ddp (torchrun, benchmark probe)"

    def __init__(self, profiler: torch.profiler.profile, clock: StageClock):
        self.profiler, self.clock, self.steps = profiler, clock, 0

    def optimizer_step(self, scaler, optimizer):
        super().optimizer_step(scaler, optimizer)
        self.steps += 1
        self.clock.counting = self.steps >= STEADY_STATE_SKIP_STEPS  # as the result's steady step time
        self.profiler.step()


def main() -> None:
    cfg = parse_args(sys.argv[1:], prog="benchmarks/_strategy_probe.py")
    clock = StageClock(torch.device("cuda") if cfg.device == "cuda" else torch.device("cpu"))
    base = pipelining_stage._PipelineStageBase
    base.forward_one_chunk = clock.timed(base.forward_one_chunk, "busy")
    base.backward_one_chunk = clock.timed(base.backward_one_chunk, "busy")
    PipelineParallel.forward_backward = clock.timed(PipelineParallel.forward_backward, "span")
    traces: list[dict] = []

    def keep_trace(profiler) -> None:
        with tempfile.NamedTemporaryFile(suffix=".json") as trace:
            profiler.export_chrome_trace(trace.name)
            traces.extend(json.loads(Path(trace.name).read_text())["traceEvents"])

    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, on_trace_ready=keep_trace,
        schedule=torch.profiler.schedule(wait=PROFILE_AFTER_STEPS - 1, warmup=1, active=PROFILED_STEPS,
                                         repeat=1))
    with profiler:
        train(cfg, ProbeHooks(profiler, clock))
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
    sent, calls, unknown = sent_bytes(traces, world_size)
    probe = {"rank": rank, "world_size": world_size, "profiled_steps": PROFILED_STEPS if traces else 0,
             "sent_bytes_per_step": sent / PROFILED_STEPS if traces else None,
             "c10d_calls_per_step": {name: count / PROFILED_STEPS for name, count in sorted(calls.items())},
             "unknown_c10d_ops": unknown,
             "stage_busy_s": clock.seconds["busy"], "stage_span_s": clock.seconds["span"],
             "stage_idle_fraction": (1 - clock.seconds["busy"] / clock.seconds["span"]
                                     if clock.seconds["span"] else None)}
    Path(cfg.output_dir, f"probe-rank{rank}.json").write_text(json.dumps(probe, indent=1))


if __name__ == "__main__":
    main()
