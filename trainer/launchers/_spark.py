"""The Spark launcher's session: its own application on a standalone master, with the conf it sets for
the run, or a session on a Spark Connect server; and what it reads back from Spark's effective conf."""

import gc
import os
import signal
import urllib.parse
from pathlib import Path

from trainer.config import ConfigError
from trainer.launchers import _cli

SECRET_ENV = "SPARK_AUTHENTICATE_SECRET"
# How a run's result names its setup (the harness's spark platform reads them too): the report keeps the
# two apart, so a standalone application's runs and a Connect server's sessions never share a mean.
STANDALONE_LABEL = "spark (TorchDistributor, standalone)"
CONNECT_LABEL = "spark (TorchDistributor, Spark Connect)"
# Spark Connect's shared token: pyspark's client and Spark's Connect server both read this variable, so it
# stays out of argv and the URL. Without TLS the client sends a token only to "localhost": the server
# runs on the master beside the cell's driver and listens on loopback.
CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
CONNECT_DEFAULT_PORT = 15002  # Spark Connect's own default (spark.connect.grpc.binding.port)


def train_on_executor(cfg, framework_label: str, etl=None) -> dict | None:
    """Each training process's function. Here, not in the launcher: TorchDistributor pickles it by
    reference, so every training process imports its module, and this one imports no pyspark (0.3 s
    against the launcher's 0.9 s, timed by hand). `etl`: what _spark_etl.platform_etl gives on the
    platform path (the run, the directories of its rows), else None."""
    from trainer.core import TrainHooks, train  # here, not on top: Spark's Python worker need not load torch
    from trainer.launchers._spark_etl import etl_hooks

    # The default file checkpoints in cfg.checkpoint_dir, on rank 0's node.
    hooks = TrainHooks() if etl is None else etl_hooks(*etl)
    hooks.framework, hooks.framework_label = "spark", framework_label
    result = train(cfg, hooks)
    gc.freeze()  # TorchDistributor's process exits once it has pickled this: skip its final collection
    return result


def session(cfg, args):
    """A session on the Spark Connect server at --remote (its executors already up; its conf is the
    server's, so --spark-conf is refused), else the run's own application on --master."""
    from pyspark.sql import SparkSession  # here: --help and bad flags need no pyspark

    if args.remote:
        url = urllib.parse.urlsplit(args.remote)
        if url.scheme != "sc" or not url.hostname:
            raise ConfigError(f"--remote: must be sc://HOST:PORT of a Spark Connect server, "
                              f"got {args.remote!r}")
        if args.spark_conf:
            raise ConfigError("--spark-conf: a Spark Connect session runs with its server's conf; "
                              "set it where the server starts")
        address = f"{url.hostname}:{url.port or CONNECT_DEFAULT_PORT}"
        _cli.reachable(address, "a Spark Connect server", "--remote")
        spark = SparkSession.builder.remote(args.remote).getOrCreate()
        try:
            spark.version  # noqa: B018 - the first call to the server, which checks the token
        except Exception as error:  # SparkConnectGrpcException, whose module needs the connect extra
            if "UNAUTHENTICATED" not in str(error):
                raise
            raise ConfigError(f"--remote: {args.remote} refused the token in ${CONNECT_TOKEN_ENV}") from None
        release_when_stopped()
        return spark
    if not str(args.master).startswith("spark://"):
        raise ConfigError("need --master spark://HOST:PORT ($SPARK_MASTER_URL) or --remote sc://HOST:PORT")
    os.environ.pop("SPARK_REMOTE", None)  # pyspark's builder would go to a Connect server instead
    return SparkSession.builder.master(args.master).config(map=spark_conf(cfg, args)).getOrCreate()


def release_when_stopped() -> None:
    """SIGTERM (a stopped cell: timeout, Ctrl-C, cluster.reset) ends the launcher through the `finally`
    that stops its session, as Ctrl-C's SIGINT does: the server then cancels the session's jobs. Killed
    outright, the launcher would leave its barrier tasks holding the server's executors, where the next
    cell would find no free slots."""

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def spark_conf(cfg, args) -> dict[str, str]:
    """The session's conf: N barrier slots of `threads` cores, the secret, then the caller's --spark-conf."""
    conf = {"spark.app.name": "dtlab", "spark.executor.cores": cfg.threads, "spark.task.cpus": cfg.threads,
            "spark.cores.max": cfg.threads * args.num_processes,  # exactly N slots, spread over workers
            "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",  # wait for N free slots, but
            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": 30}  # 30 s, not Spark's ~10 min
    if cfg.device == "cuda":  # TorchDistributor's use_gpu needs an integer GPU amount per task
        conf |= {"spark.task.resource.gpu.amount": 1, "spark.executor.resource.gpu.amount": 1}
    if secret := os.environ.get(SECRET_ENV) or (args.secret_file and Path(args.secret_file).read_text()):
        conf |= {"spark.authenticate": "true", "spark.authenticate.secret": secret.strip()}
    if bad := [pair for pair in args.spark_conf if "=" not in pair]:
        raise ConfigError(f"--spark-conf {bad[0]}: expected KEY=VALUE")
    conf |= dict(pair.split("=", 1) for pair in args.spark_conf)  # the caller's conf wins
    return {key: str(value) for key, value in conf.items()}


def jvm_label(effective_conf) -> str:
    """" + JVM <its -XX options>" for the executors' JVM options (the spark role's spark_jvm_options, from
    spark-defaults.conf or --spark-conf), "" for the JVM's defaults. Spark adds its own module options
    (--add-opens ..., -XX:+IgnoreUnrecognizedVMOptions) to the same key: they are not a setup and are
    left out."""
    options = (effective_conf.get("spark.executor.extraJavaOptions", None) or "").split()
    tuning = [option for option in options
              if option.startswith("-XX:") and option != "-XX:+IgnoreUnrecognizedVMOptions"]
    return f" + JVM {' '.join(tuning)}" if tuning else ""
