"""Determined launcher: the trainer core under Determined's Core API (experiments/determined/*.yaml).

On a cluster: python3 -m determined.launch.torch_distributed python3 -m trainer.launchers.determined ...
(the trial's hyperparameters override flags). Off-cluster (no master) run it under torchrun: core.init()
hands out dummy contexts and the result is labelled "determined (Core API, off-cluster)".
"""

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path

import determined as det
from determined import core

from trainer.config import ConfigError, build_parser, from_dict, parse_args
from trainer.core import TrainHooks, train

PROG = "python -m trainer.launchers.determined"
CLUSTER_LABEL, OFF_CLUSTER_LABEL = "determined (Core API, cluster)", "determined (Core API, off-cluster)"


class DeterminedHooks(TrainHooks):
    framework = "determined"

    def __init__(self, context: core.Context, info, local_dir: str | None, preempt_after_epoch: int | None):
        self.context, self.info, self.local_dir = context, info, None if info else local_dir
        self.preempt_after_epoch, self.epoch = preempt_after_epoch, 0
        self.framework_label = CLUSTER_LABEL if info else OFF_CLUSTER_LABEL
        self.restores = contextlib.ExitStack()  # keeps restored checkpoint files until training ends

    def resume_path(self) -> Path | None:
        storage_id = self.info.latest_checkpoint if self.info else latest_local_checkpoint(self.local_dir)
        if storage_id is None:
            return None
        # The core calls this on rank 0 only, so no collective download mode (it would wait for the others).
        restore = self.context.checkpoint.restore_path(storage_id, core.DownloadMode.NoSharedDownload)
        return Path(self.restores.enter_context(restore))

    @contextlib.contextmanager
    def checkpoint_path(self, epoch: int):
        if self.context.distributed.rank != 0 or not (self.info or self.local_dir):
            yield None  # only the chief stores; off-cluster without a checkpoint_dir nothing is kept
            return
        with self.context.checkpoint.store_path({"steps_completed": epoch, "epoch": epoch}) as (path, _):
            yield Path(path)

    def on_epoch_end(self, epoch: int, metrics: dict) -> None:
        self.epoch = epoch
        if self.context.distributed.rank == 0:
            training = {key: value for key, value in metrics.items() if key.startswith("train")}
            validation = {key: value for key, value in metrics.items() if key.startswith("val")}
            self.context.train.report_training_metrics(steps_completed=epoch, metrics=training)
            self.context.train.report_validation_metrics(steps_completed=epoch, metrics=validation)

    def should_stop(self) -> bool:
        preempted = self.context.preempt.should_preempt()  # every rank asks; the chief broadcasts
        return preempted or self.epoch >= (self.preempt_after_epoch or sys.maxsize)


def latest_local_checkpoint(local_dir: str | None) -> str | None:
    """Off-cluster no master remembers the latest checkpoint: take the highest epoch on disk."""
    found = [(json.loads(meta.read_text())["epoch"], meta.parent.name)
             for meta in Path(local_dir or "/nonexistent").glob("*/metadata.json")]
    return max(found)[1] if found else None


def add_determined_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument_group("determined").add_argument(
        "--preempt-after-epoch", type=int, metavar="K",
        help="TEST HOOK, not for real runs: act as if Determined preempted the trial after epoch K")
    return parser


def main(argv: list[str] | None = None) -> int:
    add_determined_flags(build_parser(PROG, __doc__)).parse_args(argv)  # --help; unknown flags fail here
    args, trainer_argv = add_determined_flags(argparse.ArgumentParser(add_help=False)).parse_known_args(argv)
    try:
        cfg, info = parse_args(trainer_argv, PROG), det.get_cluster_info()
        if info is not None:  # on a cluster the trial's hyperparameters are the protocol
            cfg = from_dict({**cfg.as_dict(), **info.trial.hparams})
        distributed = core.DistributedContext.from_torch_distributed() if "RANK" in os.environ else None
        storage = None if info or not cfg.checkpoint_dir else str(Path(cfg.checkpoint_dir).resolve())
        with core.init(distributed=distributed, checkpoint_storage=storage) as context:
            hooks = DeterminedHooks(context, info, storage, args.preempt_after_epoch)
            cfg = dataclasses.replace(cfg, framework="determined", framework_label=hooks.framework_label)
            with hooks.restores:
                train(cfg, hooks)  # returns early, after a checkpoint, when should_stop() says so
    except ConfigError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
