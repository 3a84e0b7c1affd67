"""Ray Tune launcher: a search plan's trials as Tune trials on the Ray cluster, each running the core in a
process of its own on a worker; with the plan's early_stopping asha, Tune's ASHAScheduler stops them at the
plan's rungs (trainer/search.py).

    python -m trainer.launchers.ray_tune --config C.yml --search plan.json --address HEAD:6379
"""

import os
import time
from pathlib import Path

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from trainer.core import TrainHooks, train
from trainer.launchers import _cli
from trainer.launchers.ray import FORWARDED, PLAIN_PRINT
from trainer.search import METRIC, search_result, trial_line, trial_record, write_search_result

PROG, LABEL = "python -m trainer.launchers.ray_tune", "ray-tune (Ray Tune, ASHAScheduler)"


def add_tune_flags(parser):
    group = parser.add_argument_group("ray tune")
    group.add_argument("--search", required=True, type=_cli.search_plan,
                       help="the search plan (JSON) the harness wrote")
    group.add_argument("--address", required=True, help="Ray's GCS, HOST:PORT (token: $RAY_AUTH_TOKEN_PATH)")
    return parser


class TuneHooks(TrainHooks):
    framework_label = LABEL

    def __init__(self):
        self.started = time.time()

    def on_epoch_end(self, epoch: int, metrics: dict) -> None:  # Tune's scheduler decides on each report
        tune.report({"epoch": epoch, METRIC: metrics[METRIC], "ended": time.time(), "started": self.started})


def run_trial(config, base, plan, output_root):  # in a Tune actor on a worker
    train(plan.trial_config(base, config["trial"], output_root), TuneHooks())


def launch(cfg, args) -> None:
    plan, started = args.search, time.time()
    env = {key: os.environ[key] for key in FORWARDED if key in os.environ} | PLAIN_PRINT
    ray.init(_cli.reachable(args.address, "Ray's GCS"), runtime_env={"env_vars": env})
    slots = int(ray.cluster_resources().get("CPU", 0) // cfg.threads)
    output_root = Path(cfg.output_dir).resolve()  # Tune's actors start elsewhere
    scheduler = FIFOScheduler() if plan.asha() is None else ASHAScheduler(
        time_attr="epoch", max_t=plan.budget_epochs, grace_period=plan.grace_epochs,
        reduction_factor=plan.reduction_factor)
    trainable = tune.with_resources(tune.with_parameters(run_trial, base=cfg, plan=plan, output_root=str(
        output_root)), {"cpu": cfg.threads})
    grid = tune.Tuner(trainable, param_space={"trial": tune.grid_search(list(range(len(plan.trials))))},
                      tune_config=tune.TuneConfig(metric=METRIC, mode="max", scheduler=scheduler),
                      run_config=tune.RunConfig(storage_path=str(output_root), name="tune",
                                                 verbose=1)).fit()  # 1: no table per report
    trials = []
    for result in grid:
        number = result.config["trial"]
        rows = result.metrics_dataframe.to_dict("records") if result.metrics_dataframe is not None else []
        epochs = [{"epoch": int(row["epoch"]), METRIC: row[METRIC], "ended": row["ended"]} for row in rows]
        error = None if result.error is None else str(result.error).strip().splitlines()[-1]
        trials.append(trial_record(number, plan.trials[number], rows[0]["started"] if rows else started,
                                   epochs, plan.budget_epochs, error))
    for trial in sorted(trials, key=lambda trial: trial["number"]):
        print(trial_line(trial, len(plan.trials)), flush=True)
    result = search_result("ray-tune", LABEL, plan, trials, started, time.time(), max(slots, 1), 1)
    print(f"search: {write_search_result(result, cfg.output_dir)}")


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, add_tune_flags)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
