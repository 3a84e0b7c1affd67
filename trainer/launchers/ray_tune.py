"""Ray Tune launcher: a search plan's trials as Tune trials on the Ray cluster, at most --max-concurrent at
once, each running the core in its own process on a worker (a GPU each where offered); with early_stopping
asha, Tune's ASHAScheduler stops them at the plan's rungs (trainer/search.py).
    python -m trainer.launchers.ray_tune --config C.yml --search plan.json --address H:6379 --max-concurrent 2
"""

import os
import time

import ray
from ray import tune

from trainer.core import TrainHooks, train
from trainer.distributed import scheduler_gives_gpus
from trainer.launchers import _cli
from trainer.launchers.ray import FORWARDED, PLAIN_PRINT
from trainer.search import METRIC, search_result, trial_line, trial_record, write_search_result

PROG, LABEL = "python -m trainer.launchers.ray_tune", "ray-tune (Ray Tune, ASHAScheduler)"


def add_tune_flags(parser):
    group = parser.add_argument_group("ray tune")
    group.add_argument("--search", required=True, type=_cli.search_plan,
                       help="the search plan (JSON) the harness wrote")
    group.add_argument("--address", required=True, help="Ray's GCS, HOST:PORT (token: $RAY_AUTH_TOKEN_PATH)")
    group.add_argument("--max-concurrent", type=_cli.at_least(1), help="trials at once (default: the slots)")
    return parser


class TuneHooks(TrainHooks):
    framework_label = LABEL

    def __init__(self):
        self.started = time.time()

    def on_epoch_end(self, epoch: int, metrics: dict) -> None:  # Tune's scheduler decides on each report
        tune.report({"epoch": epoch, METRIC: metrics[METRIC], "ended": time.time(), "started": self.started})


def run_trial(config, base, plan):  # in a Tune actor on a worker
    train(plan.trial_config(base, config["trial"], base.output_dir), TuneHooks())


def launch(cfg, args) -> None:
    plan, started, label = args.search, time.time(), cfg.framework_label or LABEL  # the harness's label
    env = {key: os.environ[key] for key in FORWARDED if key in os.environ} | PLAIN_PRINT
    ray.init(_cli.reachable(args.address, "Ray's GCS"), runtime_env={"env_vars": env})
    offered = ray.cluster_resources()
    gpus = scheduler_gives_gpus(cfg.device, offered.get("GPU", 0))
    cfg = _cli.with_absolute_dirs(cfg, device="cuda" if gpus else "cpu")  # Tune's actors start elsewhere
    slots = min(int(offered.get("GPU", 0)) if gpus else int(offered.get("CPU", 0) // cfg.threads),
                args.max_concurrent or len(plan.trials))
    scheduler = tune.schedulers.FIFOScheduler() if plan.asha() is None else tune.schedulers.ASHAScheduler(
        time_attr="epoch", max_t=plan.budget_epochs, grace_period=plan.grace_epochs,
        reduction_factor=plan.reduction_factor)
    trainable = tune.with_resources(tune.with_parameters(run_trial, base=cfg, plan=plan),
                                    {"cpu": cfg.threads, "gpu": 1 if gpus else 0})
    grid = tune.Tuner(trainable, param_space={"trial": tune.grid_search(list(range(len(plan.trials))))},
                      tune_config=tune.TuneConfig(metric=METRIC, mode="max", scheduler=scheduler,
                                                  max_concurrent_trials=args.max_concurrent),
                      run_config=tune.RunConfig(storage_path=cfg.output_dir, name="tune", verbose=1)).fit()
    trials = []
    for result in grid:  # verbose 1 above: Tune's status lines, not a table per report
        rows = [] if result.metrics_dataframe is None else result.metrics_dataframe.to_dict("records")
        epochs = [{"epoch": int(row["epoch"]), METRIC: row[METRIC], "ended": row["ended"]} for row in rows]
        number, error = result.config["trial"], result.error and str(result.error).strip().splitlines()[-1]
        trials.append(trial_record(number, plan.trials[number], rows[0]["started"] if rows else started,
                                   epochs, plan.budget_epochs, error))
    print("\n".join(trial_line(one, len(plan.trials)) for one in sorted(trials, key=lambda t: t["number"])))
    result = search_result("ray-tune", label, plan, trials, started, time.time(), max(slots, 1), 1)
    print(f"search: {write_search_result(result, cfg.output_dir)}")


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, add_tune_flags)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
