"""The Spark conf the Spark launcher sets for a run, and what it reads back from Spark's effective conf."""

import os
from pathlib import Path

from trainer.config import ConfigError

SECRET_ENV = "SPARK_AUTHENTICATE_SECRET"


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
    options = (effective_conf.get("spark.executor.extraJavaOptions") or "").split()
    tuning = [option for option in options
              if option.startswith("-XX:") and option != "-XX:+IgnoreUnrecognizedVMOptions"]
    return f" + JVM {' '.join(tuning)}" if tuning else ""
