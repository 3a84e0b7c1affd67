"""Ray launcher: TorchTrainer runs the core on --num-workers workers (elastic: 1 to N); trainer/README.md."""

import os
from pathlib import Path

import ray.train
from ray.train.torch import TorchConfig, TorchTrainer

from trainer import progress
from trainer.core import TrainHooks, train
from trainer.distributed import scheduler_gives_gpus
from trainer.launchers import _cli, _ray_data
from trainer.result import write_result

PROG, LABEL = "python -m trainer.launchers.ray", "ray (Ray Train, TorchTrainer)"
# The driver's environment the workers need; not *_SOCKET_IFNAME: each node's Ray service sets its own.
FORWARDED = ("PYTHONPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "HF_HOME", "TOKENIZERS_PARALLELISM")
PLAIN_PRINT = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}  # Ray's print logs each line twice (and dill's dis)


def add_ray_flags(parser):
    parser.conflict_handler = "resolve"  # --num-workers is Ray's here; the trainer keeps --num_workers
    group = parser.add_argument_group("ray")
    group.add_argument("--num-workers", type=_cli.at_least(1), default=2, help="training processes")
    group.add_argument("--address", required=True, help="Ray's GCS, HOST:PORT (token: $RAY_AUTH_TOKEN_PATH)")
    group.add_argument("--max-failures", type=_cli.at_least(0), default=1, help="group restarts Ray may make")
    return parser


class RayHooks(_ray_data.RayDataHooks):  # data_path platform: Ray Data's rows (_ray_data)
    framework, framework_label, metrics = "ray", LABEL, {}

    def resume_path(self) -> Path | None:  # Ray's latest (after a restart) if on this node's disk, else ours
        reported = ray.train.get_checkpoint()
        if reported and not os.path.isdir(reported.path):  # Ray put rank 0 on another node: no shared disk
            print(f"{progress.LOG_PREFIX}Ray's latest checkpoint {reported.path} is on another node")
        return Path(reported.path) if reported and os.path.isdir(reported.path) else super().resume_path()

    def on_epoch_end(self, epoch: int, metrics: dict) -> None:  # rank 0 only, before the epoch's checkpoint
        self.metrics = metrics

    def should_stop(self) -> bool:  # every rank after each checkpoint: Ray wants as many reports from each
        saved = TrainHooks.resume_path(self) if self.metrics else None  # rank 0's, just written
        ray.train.report(self.metrics, saved and ray.train.Checkpoint.from_directory(saved),
                         checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD)  # in place
        return False


def launch(cfg, args) -> None:
    env = {key: os.environ[key] for key in FORWARDED if key in os.environ} | PLAIN_PRINT
    ray.init(_cli.reachable(args.address, "Ray's GCS"), runtime_env={"env_vars": env})
    gpus = scheduler_gives_gpus(cfg.device, ray.cluster_resources().get("GPU", 0))
    cfg = _cli.with_absolute_dirs(cfg, framework="ray", device="cuda" if gpus else "cpu")
    run_dir = Path(cfg.checkpoint_dir or Path(cfg.output_dir, "ray-run"))
    run, ray_data = _ray_data.etl(cfg, PROG)  # platform: Ray Data's ETL; TorchTrainer's datasets, its rows
    workers = (1, args.num_workers) if cfg.elastic else args.num_workers  # elastic: as many as fit, from 1
    trainer = TorchTrainer(  # placed as dtlab places ddp: on CPU one worker a node, GPUs filled node by node
        lambda _: train(cfg, RayHooks(run)), torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=gpus,  # 1 GPU a worker
            resources_per_worker=None if gpus else {"CPU": cfg.threads},
            placement_strategy="PACK" if gpus else "SPREAD"), **ray_data,
        run_config=ray.train.RunConfig(storage_path=str(run_dir.parent), name=run_dir.name,
                                       failure_config=ray.train.FailureConfig(max_failures=args.max_failures)))
    try:
        result = trainer.fit().return_value  # rank 0's: train()'s result dict
    except ray.train.TrainingFailedError as error:  # its last line is the workers' last exception
        raise SystemExit(f"{PROG}: error: Ray gave up after {args.max_failures} restart(s): "
                         f"{str(error).strip().splitlines()[-1]}") from None
    print(f"result: {write_result(result, cfg.output_dir)}")  # rank 0 may have run on another node


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, add_ray_flags)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
