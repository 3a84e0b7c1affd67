"""Horovod launcher: `horovodrun --gloo -np 2 -H n1:1,n2:1 python -m trainer.launchers.horovod --config F`.
Horovod's ring all-reduce averages the gradients (hvd.DistributedOptimizer) in place of DDP's; the
core's other collectives (metrics, checkpoints) use a torch group formed from Horovod's ranks. With
`elastic: true` (horovodrun --min-np 1) the survivors of a lost rank go on: _horovod_elastic.py."""

from __future__ import annotations

import os
import socket

import horovod.torch as hvd

from trainer.core import TrainHooks, train
from trainer.launchers import _cli, _horovod_elastic
from trainer.strategies.compression import uncompressed_bytes

PROG, LABEL = "python -m trainer.launchers.horovod", "horovod (horovodrun, Gloo)"
COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}  # Horovod's own


class HorovodHooks(TrainHooks):
    framework, framework_label, syncs_gradients = "horovod", LABEL, True
    gradient_compressions = tuple(COMPRESSIONS)

    def wrap_model(self, model):  # every rank seeds the same weights; Horovod's idiom makes sure
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return model

    def wrap_optimizer(self, optimizer, model):
        # Gradient accumulation: Horovod all-reduces each gradient once every grad_accum_steps backwards.
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        backward_passes_per_step=self.cfg.grad_accum_steps,
                                        compression=COMPRESSIONS[self.cfg.grad_compression])

    def gradient_sync(self, model):
        sent = uncompressed_bytes(model, 2 if self.cfg.grad_compression == "fp16" else None)
        return {"bytes_per_step": sent, "counted": "every trainable gradient"}

    def optimizer_step(self, scaler, optimizer):
        if not scaler.is_enabled():  # step() waits for the all-reduces backward started
            return scaler.step(optimizer)
        optimizer.synchronize()  # fp16 (CUDA-only): Horovod's recipe, averaged before unscaling
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)


def torch_group_env() -> dict[str, str]:
    """env:// for the core's torch group: Horovod's ranks, rank 0's host and a port it found free."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()  # -H's name for this host
    master_host, master_port = hvd.broadcast_object((host, port), root_rank=0, name="dtlab.torch_group")
    return {"RANK": str(hvd.rank()), "WORLD_SIZE": str(hvd.size()), "LOCAL_RANK": str(hvd.local_rank()),
            "LOCAL_WORLD_SIZE": str(hvd.local_size()), "MASTER_ADDR": master_host,
            "MASTER_PORT": str(master_port)}


def launch(cfg, args) -> None:
    hvd.init()
    if hvd.size() > 1 and not hvd.gloo_enabled():
        raise SystemExit(f"{PROG}: error: Horovod runs without Gloo here; start it with horovodrun --gloo")
    if cfg.elastic:
        _horovod_elastic.run(cfg, HorovodHooks, torch_group_env)
    else:
        os.environ.update(torch_group_env())
        train(cfg, HorovodHooks())


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, lambda parser: parser)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
