"""Spark launcher: `python -m trainer.launchers.spark --config F.yml --num-processes 2 --master spark://H:7077`.

The trainer core runs through TorchDistributor, each process as one barrier task on an executor of
`threads` cores. The auth secret comes from $SPARK_AUTHENTICATE_SECRET or --spark-secret-file, never argv.
"""

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path

from pyspark.ml.torch.distributor import TorchDistributor
from pyspark.sql import SparkSession

from trainer.config import ConfigError, build_parser, parse_args
from trainer.result import write_result

PROG, LABEL = "python -m trainer.launchers.spark", "spark (TorchDistributor, standalone)"
SECRET_ENV = "SPARK_AUTHENTICATE_SECRET"
PANDAS_WARNING = "PySpark does not yet fully support pandas"  # pyspark 4.3 vs pandas 3: harmless here


def add_spark_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("spark")
    group.add_argument("--num-processes", type=int, default=2, help="training processes (barrier tasks)")
    group.add_argument("--master", default=os.environ.get("SPARK_MASTER_URL"), help="spark://host:port")
    group.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="extra conf")
    group.add_argument("--spark-secret-file", help=f"holds spark.authenticate.secret (or ${SECRET_ENV})")
    return parser


def train_on_executor(cfg, framework_label: str) -> dict | None:
    from trainer.core import TrainHooks, train  # here, not on top: Spark's Python worker need not load torch

    hooks = TrainHooks()  # the default file checkpoints in cfg.checkpoint_dir, on rank 0's node
    hooks.framework, hooks.framework_label = "spark", framework_label
    return train(cfg, hooks)


def spark_conf(cfg, args) -> dict[str, str]:
    conf = {"spark.executor.cores": cfg.threads, "spark.task.cpus": cfg.threads,
            "spark.cores.max": cfg.threads * args.num_processes,  # exactly N slots, spread over workers
            # Barrier jobs wait for N free slots: re-check every second while executors register,
            # and give up after 30 s (Spark's default is 40 checks 15 s apart, ~10 min).
            "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": 30,
            "spark.executorEnv.PYTHONWARNINGS": f"ignore:{PANDAS_WARNING}:FutureWarning"}
    if cfg.device == "cuda":  # TorchDistributor's use_gpu needs an integer GPU amount per task
        conf |= {"spark.task.resource.gpu.amount": 1, "spark.executor.resource.gpu.amount": 1}
    secret_file = args.spark_secret_file
    if secret := os.environ.get(SECRET_ENV) or (secret_file and Path(secret_file).read_text()):
        conf |= {"spark.authenticate": "true", "spark.authenticate.secret": secret.strip()}
    if bad := [pair for pair in args.spark_conf if "=" not in pair]:
        raise ConfigError(f"--spark-conf {bad[0]}: expected KEY=VALUE")
    conf |= dict(pair.split("=", 1) for pair in args.spark_conf)  # the caller's conf wins
    return {key: str(value) for key, value in conf.items()}


def run(cfg, args) -> dict | None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the builder's spark.pyspark.python is ignored
    warnings.filterwarnings("ignore", message=PANDAS_WARNING, category=FutureWarning)
    spark = SparkSession.builder.master(args.master).appName("dtlab-spark").config(map=spark_conf(cfg, args))
    spark = spark.getOrCreate()
    try:
        use_gpu = int(float(spark.conf.get("spark.task.resource.gpu.amount", "0"))) >= 1
        distributor = TorchDistributor(args.num_processes, local_mode=False, use_gpu=use_gpu)
        return distributor.run(train_on_executor, cfg, cfg.framework_label)  # trainer installed on executors
    except Exception as error:
        if "BarrierJobSlotsNumberCheckFailed" not in str(error):
            raise
        raise ConfigError(f"--num-processes {args.num_processes}: {args.master} has fewer free slots of "
                          f"{cfg.threads} core(s); add workers or cores, or lower it") from None
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    add_spark_flags(build_parser(PROG, __doc__)).parse_args(argv)  # --help; unknown flags fail here
    args, trainer_argv = add_spark_flags(argparse.ArgumentParser(add_help=False)).parse_known_args(argv)
    try:
        cfg = parse_args(trainer_argv, PROG)
        cfg = dataclasses.replace(cfg, framework="spark", framework_label=cfg.framework_label or LABEL)
        if args.num_processes < 1 or not str(args.master).startswith("spark://"):
            raise ConfigError("need --num-processes >= 1 and --master spark://HOST:PORT ($SPARK_MASTER_URL)")
        if (result := run(cfg, args)) is not None:  # rank 0 may be on another node: copy it to the driver's
            print(f"result: {write_result(result, cfg.output_dir)}")
    except ConfigError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
