"""torchrun launcher: run the training core under torchrun (env:// rendezvous) or as one plain process.

    torchrun --nnodes=2 --nproc_per_node=1 --node_rank=0 --master_addr=HOST --master_port=29500 \\
        -m trainer.launchers.torchrun --config experiments/trainer/study.yml --epochs 20
    python -m trainer.launchers.torchrun --config experiments/trainer/smoke.yml     # one process

Flags override the YAML file; `--help` lists them all. Bad values exit 2 with one line.
"""

from __future__ import annotations

import os
import sys

from trainer.config import ConfigError
from trainer.launchers import _cli
from trainer.options import parse_args


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv, prog="python -m trainer.launchers.torchrun", description=__doc__)
        from trainer.core import TrainHooks, train  # torch loads only once the flags are known good

        label = "ddp (torchrun)" if "TORCHELASTIC_RUN_ID" in os.environ else "ddp (single process)"
        hooks = TrainHooks()
        hooks.framework_label = label
        train(cfg, hooks)
    except ConfigError as error:
        print(f"trainer: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
