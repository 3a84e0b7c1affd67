"""Sweep launcher: a search plan's trials one after another, each a run of the core under torchrun (or as
one process); with the plan's early_stopping asha, dtlab's own ASHA rule stops a trial at a rung
(trainer/search.py).

    torchrun --nnodes=1 --nproc_per_node=1 -m trainer.launchers.sweep --config C.yml --search plan.json
"""

import os
import time

from trainer.core import TrainHooks, train
from trainer.distributed import process_group, resolve_device
from trainer.launchers import _cli
from trainer.search import (
    METRIC,
    search_result,
    trial_line,
    trial_record,
    write_search_result,
)

PROG = "python -m trainer.launchers.sweep"
LABEL = "sweep (torchrun, one trial at a time)"


def add_sweep_flags(parser):
    group = parser.add_argument_group("sweep")
    group.add_argument("--search", required=True, type=_cli.search_plan,
                       help="the search plan (JSON) the harness wrote")
    group.add_argument("--slots", type=_cli.at_least(1), default=1,
                       help="the cluster's training slots, for the busy fraction (default 1)")
    return parser


class SweepHooks(TrainHooks):
    framework_label = LABEL

    def __init__(self, asha, number: int):
        self.asha, self.number, self.epochs, self.decision = asha, number, [], "continue"

    def on_epoch_end(self, epoch: int, metrics: dict) -> None:  # rank 0 only: it decides for every rank
        self.epochs.append({"epoch": epoch, METRIC: metrics[METRIC], "ended": time.time()})
        if self.asha is not None:
            self.decision = self.asha.report(self.number, epoch, metrics[METRIC])

    def should_stop(self) -> bool:  # every rank; the core OR-s the answers, so rank 0's stop stops all
        return self.decision == "stop"


def launch(cfg, args) -> None:
    plan, started, trials = args.search, time.time(), []
    asha, rank, world = plan.asha(), int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    # One process group for every trial: each train() joins it. A group destroyed and formed again on
    # torchrun's store finds the first one's keys there, and across nodes one rank then waits forever.
    with process_group(resolve_device(cfg)):
        for number, options in enumerate(plan.trials):
            hooks, trial_started = SweepHooks(asha, number), time.time()
            train(plan.trial_config(cfg, number, cfg.output_dir), hooks)
            trials.append(trial_record(number, options, trial_started, hooks.epochs, plan.budget_epochs))
            if rank == 0:
                print(trial_line(trials[-1], len(plan.trials)), flush=True)
    if rank == 0:
        way, label = "sweep-asha" if asha else "sweep", cfg.framework_label or LABEL  # the harness's label
        result = search_result(way, label, plan, trials, started, time.time(), args.slots, world)
        print(f"search: {write_search_result(result, cfg.output_dir)}")


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, add_sweep_flags)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
