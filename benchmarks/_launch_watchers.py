"""benchmarks/launcher_overhead.py's watchers over a launch's processes, each a thread beside the launch:
CpuSampler (the machine's busy CPU time and the training workers' own, per thread) and ExitWatcher (when
each layer of the launch's processes is first and last seen alive, for --split-teardown)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

import psutil


class CpuSampler(threading.Thread):
    """Every SAMPLE_S: (time, the machine's busy CPU seconds, {worker pid: its CPU seconds})."""

    SAMPLE_S = 0.5

    def __init__(self, driver_pid: int):
        super().__init__(daemon=True)
        self.driver_pid, self.samples, self.done = driver_pid, [], threading.Event()

    @staticmethod
    def busy_s() -> float:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait

    def is_worker(self, process: psutil.Process) -> bool:
        command = " ".join(process.info["cmdline"] or ())
        return command.startswith("ray::RayTrainWorker") or (
            "trainer.launchers." in command and "torch.distributed.run" not in command
            and process.pid != self.driver_pid)

    def run(self) -> None:
        while not self.done.wait(self.SAMPLE_S):
            workers = {}
            for process in psutil.process_iter(["cmdline"]):
                try:
                    if self.is_worker(process):
                        times = process.cpu_times()
                        threads = {thread.id: thread.user_time + thread.system_time
                                   for thread in process.threads()}
                        workers[process.pid] = (times.user + times.system, threads)
                except psutil.Error:  # ended between the listing and the read
                    continue
            self.samples.append((time.time(), self.busy_s(), workers))

    def beside_workers_cores(self, start: float, end: float) -> float | None:
        """Cores the machine used beside the training workers between start and end (unix seconds)."""
        inside = [sample for sample in self.samples if start <= sample[0] <= end]
        if len(inside) < 2 or not inside[0][2]:
            return None
        (t0, busy0, workers0), (t1, busy1, workers1) = inside[0], inside[-1]
        worker_s = sum(workers1[pid][0] - workers0[pid][0] for pid in workers0 if pid in workers1)
        return (busy1 - busy0 - worker_s) / (t1 - t0)

    def worker_threads_cores(self, start: float, end: float) -> tuple[float, float] | None:
        """Cores each worker process used between start and end, on average over the workers: (its busiest
        thread, its other threads).
        The busiest thread runs the training loop (torchrun's main thread, Ray Train's training thread);
        the others are gloo's, and under Ray its core worker's."""
        inside = [sample for sample in self.samples if start <= sample[0] <= end]
        if len(inside) < 2:
            return None
        (t0, _, first), (t1, _, last) = inside[0], inside[-1]
        per_worker = []
        for pid in first.keys() & last.keys():
            before, after = first[pid][1], last[pid][1]
            used = sorted((after[tid] - before.get(tid, 0.0) for tid in after), reverse=True)
            if used:
                per_worker.append((used[0], sum(used[1:])))
        if not per_worker:
            return None
        return (statistics.mean(busiest for busiest, _ in per_worker) / (t1 - t0),
                statistics.mean(others for _, others in per_worker) / (t1 - t0))


class ExitWatcher(threading.Thread):
    """Every EXIT_WATCH_S, the first and the last time each layer of a launch's processes was seen alive:
    the training processes (an agent's children), torchrun's agents, TorchDistributor's wrappers around the
    agents."""

    EXIT_WATCH_S = 0.1
    AGENT, WRAPPER = "torch.distributed.run", "pyspark.ml.torch.torch_run_process_wrapper"

    def __init__(self):
        super().__init__(daemon=True)
        self.first_seen: dict[str, float] = {}
        self.last_seen: dict[str, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.EXIT_WATCH_S):
            alive = {}
            for process in psutil.process_iter(["cmdline", "ppid"]):
                command = " ".join(process.info["cmdline"] or ())
                layer = "wrappers" if self.WRAPPER in command else "agents" if self.AGENT in command else None
                if layer:
                    alive[process.pid] = layer
            now = time.time()
            layers = set(alive.values())
            if any(alive.get(process.info["ppid"]) == "agents" for process in psutil.process_iter(["ppid"])):
                layers.add("workers")
            for layer in layers:
                self.first_seen.setdefault(layer, now)
                self.last_seen[layer] = now
