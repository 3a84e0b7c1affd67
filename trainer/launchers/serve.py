"""Plain serving baseline: one FastAPI app in one uvicorn process on this node, answering POST /predict
with the run's newest checkpoint (trainer/serving.py); Ray Serve's deployment (ray_serve) answers the same.

    python -m trainer.launchers.serve --config C.yml --host ADDRESS --port 8100
"""

import time

from trainer.config import PREDICT_PATH
from trainer.launchers import _cli
from trainer.serving import Predictor, PredictRequest, PredictResponse

PROG = "python -m trainer.launchers.serve"


def add_serve_flags(parser):
    group = parser.add_argument_group("serve")
    group.add_argument("--host", required=True, help="the address to listen on (this node's cluster address)")
    group.add_argument("--port", required=True, type=_cli.at_least(1), help="the port to listen on")
    return parser


def app_for(predictor: Predictor):
    from fastapi import FastAPI

    app = FastAPI(title="dtlab plain server", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post(PREDICT_PATH)
    def predict(request: PredictRequest) -> PredictResponse:  # a plain def: FastAPI runs it in its threads
        return PredictResponse(labels=predictor.predict(request.texts))

    return app


def launch(cfg, args) -> None:
    import uvicorn

    started = time.time()
    predictor = Predictor(cfg)  # loaded before the port opens: a connection means ready
    print(f"serving {predictor.checkpoint} (epoch {predictor.epoch}) at http://{args.host}:{args.port}"
          f"{PREDICT_PATH}, loaded in {time.time() - started:.1f} s", flush=True)
    uvicorn.run(app_for(predictor), host=args.host, port=args.port, workers=1, log_level="warning",
                access_log=False, timeout_graceful_shutdown=5)


def main(argv: list[str] | None = None) -> int:
    return _cli.exit_code(PROG, lambda: launch(*_cli.parse(argv, PROG, __doc__, add_serve_flags)))


if __name__ == "__main__":
    _cli.exit_without_final_collection(main())
