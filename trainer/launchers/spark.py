"""Spark launcher: `python -m trainer.launchers.spark --config F.yml --num-processes 2 --master spark://H:7077`.

Each process is a TorchDistributor barrier task on an executor of `threads` cores. Spark auth: the secret
comes from $SPARK_AUTHENTICATE_SECRET, --spark-secret-file or $SPARK_CONF_DIR/spark-defaults.conf.
With --remote sc://localhost:PORT instead, the run is a session on a Spark Connect server that keeps its
driver and executors up between runs (token: $SPARK_CONNECT_AUTHENTICATE_TOKEN)."""

import dataclasses
import os
import sys
import warnings

from pyspark.ml.torch.distributor import TorchDistributor

from trainer.config import ConfigError
from trainer.launchers import _cli
from trainer.launchers._spark import CONNECT_LABEL, STANDALONE_LABEL, jvm_label, session, train_on_executor
from trainer.launchers._spark_etl import platform_etl
from trainer.result import write_result

PROG = "python -m trainer.launchers.spark"


def add_spark_flags(parser):
    group = parser.add_argument_group("spark")
    group.add_argument("--num-processes", type=int, default=2, help="training processes (barrier tasks)")
    group.add_argument("--master", default=os.environ.get("SPARK_MASTER_URL"), help="spark://host:port")
    group.add_argument("--remote", help="sc://localhost:port of a Spark Connect server (instead of --master)")
    group.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="extra conf")
    group.add_argument("--spark-secret-file", dest="secret_file", help="file with spark.authenticate.secret")
    return parser


def launch(cfg, args) -> None:
    label = cfg.framework_label or (CONNECT_LABEL if args.remote else STANDALONE_LABEL)
    cfg = dataclasses.replace(cfg, framework="spark", framework_label=label)
    if args.num_processes < 1:
        raise ConfigError("need --num-processes >= 1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the builder's spark.pyspark.python is ignored
    warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
    spark = session(cfg, args)
    try:
        use_gpu = int(float(spark.conf.get("spark.task.resource.gpu.amount", "0"))) >= 1
        label = cfg.framework_label + jvm_label(spark.conf)  # the JVMs' setup, as it ran
        cfg = dataclasses.replace(cfg, framework_label=label)
        distributor = TorchDistributor(args.num_processes, local_mode=False, use_gpu=use_gpu)
        with platform_etl(spark, cfg) as etl:  # data_path platform: Spark's own ETL first, in this session
            result = distributor.run(train_on_executor, cfg, cfg.framework_label, etl)  # trainer on executors
    except Exception as error:  # SPARK-24819: a barrier job needs more free slots than the cluster has
        if "BarrierJobSlotsNumberCheckFailed" not in str(error):
            raise
        raise ConfigError(f"--num-processes {args.num_processes}: {args.remote or args.master} lacks free "
                          "slots") from None
    finally:
        spark.stop()
    if result is not None:  # rank 0 may have run on another node: keep a copy where the driver runs
        print(f"result: {write_result(result, cfg.output_dir)}")


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, add_spark_flags)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
