"""Determined launcher: the trainer core under the Core API. On a cluster (experiments/determined/*.yaml):
`python3 -m determined.launch.torch_distributed python3 -m trainer.launchers.determined ...`, the trial's
hyperparameters override flags. Off-cluster (no master) run it under torchrun: core.init() hands out dummy
contexts, and the result is labelled "determined (Core API, off-cluster)", never a cluster run.
Test hook, never for real runs: DTLAB_TEST_PREEMPT_AFTER_EPOCH=K acts as a preemption after epoch K."""

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import determined as det
from determined import core

from trainer.core import TrainHooks, train
from trainer.launchers import _cli
from trainer.options import from_dict

PROG, PREEMPT_ENV = "python -m trainer.launchers.determined", "DTLAB_TEST_PREEMPT_AFTER_EPOCH"
CLUSTER_LABEL, OFF_CLUSTER_LABEL = "determined (Core API, cluster)", "determined (Core API, off-cluster)"


class DeterminedHooks(TrainHooks):
    framework = "determined"

    def __init__(self, context: core.Context, info, local_dir: str | None, preempt_after_epoch: int | None):
        self.context, self.info, self.local_dir = context, info, local_dir
        self.preempt_after_epoch, self.epoch = preempt_after_epoch, 0  # epoch: known on rank 0 only
        self.framework_label = CLUSTER_LABEL if info else OFF_CLUSTER_LABEL
        self.restores = contextlib.ExitStack()  # keeps restored checkpoint files until training ends

    def resume_path(self) -> Path | None:
        if self.info:
            storage_id = self.info.latest_checkpoint
        else:  # no master remembers the latest checkpoint: take the highest epoch on disk
            found = [(json.loads(meta.read_text())["epoch"], meta.parent.name)
                     for meta in Path(self.local_dir or "/nonexistent").glob("*/metadata.json")]
            storage_id = max(found)[1] if found else None
        # Only rank 0 asks, so not the default download mode: that one waits for every worker.
        return storage_id and Path(self.restores.enter_context(
            self.context.checkpoint.restore_path(storage_id, core.DownloadMode.NoSharedDownload)))

    @contextlib.contextmanager
    def checkpoint_path(self, epoch: int):
        if not (self.info or self.local_dir):
            yield None  # off-cluster without a checkpoint_dir nothing is kept
            return
        with self.context.checkpoint.store_path({"steps_completed": epoch, "epoch": epoch}) as (path, _):
            yield Path(path)

    def on_epoch_end(self, epoch: int, metrics: dict) -> None:
        self.epoch = epoch  # validation also reports `epochs`: an adaptive_asha search's time_metric (0.38)
        for kind, report, extra in (("train", self.context.train.report_training_metrics, {}),
                                    ("val", self.context.train.report_validation_metrics, {"epochs": epoch})):
            picked = {k: v for k, v in metrics.items() if k.startswith(kind)}
            report(steps_completed=epoch, metrics={**picked, **extra})

    def should_stop(self) -> bool:  # every rank must ask Determined (the chief broadcasts), so ask first
        return self.context.preempt.should_preempt() or self.epoch == self.preempt_after_epoch


def launch(cfg, _flags=None) -> None:
    if (info := det.get_cluster_info()) is not None:  # on a cluster the trial's hyperparameters rule
        cfg = from_dict({**cfg.as_dict(), **info.trial.hparams})
    distributed = core.DistributedContext.from_torch_distributed() if "RANK" in os.environ else None
    storage = None if info or not cfg.checkpoint_dir else str(Path(cfg.checkpoint_dir).resolve())
    with core.init(distributed=distributed, checkpoint_storage=storage) as context:
        hooks = DeterminedHooks(context, info, storage, int(os.environ.get(PREEMPT_ENV, 0)) or None)
        cfg = dataclasses.replace(cfg, framework="determined", framework_label=hooks.framework_label)
        with hooks.restores:
            train(cfg, hooks)  # returns early, after a checkpoint, when should_stop() says so


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, lambda parser: parser)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
