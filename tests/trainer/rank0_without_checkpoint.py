"""torchrun entry for test_torchrun: the core, with rank 0's own lookup finding no checkpoint, as when
Spark or Ray restart rank 0 on a node without one while another rank's node holds the newest."""

import sys

from trainer.core import TrainHooks, train
from trainer.launchers import _cli


class Rank0FindsNone(TrainHooks):
    def resume_path(self):
        return None


if __name__ == "__main__":
    cfg, _ = _cli.parse(sys.argv[1:], "rank0_without_checkpoint", __doc__, lambda parser: parser)
    train(cfg, Rank0FindsNone())
