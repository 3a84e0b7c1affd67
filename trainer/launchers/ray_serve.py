"""Ray Serve launcher: the run's newest checkpoint as a Serve deployment on the Ray cluster, one replica a
worker (a GPU each where the cluster offers GPUs), behind Serve's HTTP proxy at POST /predict: the path the
plain server (trainer.launchers.serve) answers. It serves until stopped (SIGTERM or SIGINT), then removes
the application and Serve.

    python -m trainer.launchers.ray_serve --config C.yml --address HEAD:6379 --host ADDRESS --port 8000
"""

import os
import signal
import threading

import ray
from ray import serve

from trainer.config import PREDICT_PATH, ConfigError
from trainer.distributed import scheduler_gives_gpus
from trainer.launchers import _cli
from trainer.launchers._ray_serve import deployment, replica_nodes
from trainer.launchers.ray import FORWARDED, PLAIN_PRINT

PROG, APP = "python -m trainer.launchers.ray_serve", "dtlab"
PROXIES = {"every-node": "EveryNode", "head": "HeadOnly"}  # a loopback cluster's nodes share one address


def add_serve_flags(parser):
    group = parser.add_argument_group("ray serve")
    group.add_argument("--address", required=True, help="Ray's GCS, HOST:PORT (token: $RAY_AUTH_TOKEN_PATH)")
    group.add_argument("--host", required=True, help="the address Serve's proxies listen on")
    group.add_argument("--port", required=True, type=_cli.at_least(1), help="the port they listen on")
    group.add_argument("--replicas", required=True, type=_cli.at_least(1), help="one per worker")
    group.add_argument("--proxies", choices=PROXIES, default="every-node",
                       help="a proxy on every node with a replica (default), or on the head alone")
    return parser


def _last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def launch(cfg, args) -> None:
    env = {key: os.environ[key] for key in FORWARDED if key in os.environ} | PLAIN_PRINT
    ray.init(_cli.reachable(args.address, "Ray's GCS"), runtime_env={"env_vars": env})
    gpus = scheduler_gives_gpus(cfg.device, ray.cluster_resources().get("GPU", 0))
    cfg = _cli.with_absolute_dirs(cfg, device="cuda" if gpus else "cpu")  # replicas start elsewhere
    serve.start(proxy_location=PROXIES[args.proxies], http_options={"host": args.host, "port": args.port})
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        classifier = deployment("classifier").options(num_replicas=args.replicas, ray_actor_options={
            "num_cpus": cfg.threads, "num_gpus": 1 if gpus else 0})
        try:
            serve.run(classifier.bind(cfg), name=APP, route_prefix="/")
        except RuntimeError as error:  # Serve gave up on the replicas (a missing checkpoint, say)
            raise ConfigError(f"Ray Serve could not start {APP}: {_last_line(error)}") from None
        nodes, heads = replica_nodes(APP, args.address)
        print(f"serving {cfg.checkpoint_dir} at http://{args.host}:{args.port}{PREDICT_PATH}: "
              f"{args.replicas} replicas on {nodes - heads} workers" + (" and the head" * bool(heads)),
              flush=True)
        stop.wait()
    finally:
        serve.shutdown()


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, add_serve_flags)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
