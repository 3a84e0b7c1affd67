"""Ray Serve's side of the ray_serve launcher: the deployment (the trainer's Predictor behind FastAPI, at
most one replica a node) and where Serve placed its replicas."""

from ray import serve

from trainer.config import PREDICT_PATH
from trainer.serving import Predictor, PredictRequest, PredictResponse

HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives its head node alone


def deployment(name: str):
    from fastapi import FastAPI

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @serve.deployment(name=name, max_replicas_per_node=1)
    @serve.ingress(app)
    class Classifier:
        def __init__(self, cfg):
            self.predictor = Predictor(cfg)

        @app.post(PREDICT_PATH)
        def predict(self, request: PredictRequest) -> PredictResponse:  # a plain def: Serve's threads
            return PredictResponse(labels=self.predictor.predict(request.texts))

    return Classifier


def replica_nodes(app: str, address: str) -> tuple[int, int]:
    """(nodes holding one of the application's live replicas, how many of them are the head), asked of the
    cluster at `address`: without one, Ray's State API looks for a cluster among the host's processes, and
    where it finds two (a lab node's head beside a loopback one, both in one process table) it gives up."""
    import ray
    from ray.util.state import list_actors

    replicas = list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=10_000)
    nodes = {actor.node_id for actor in replicas if actor.class_name.startswith(f"ServeReplica:{app}:")}
    heads = {node["NodeID"] for node in ray.nodes() if node["Alive"] and HEAD_RESOURCE in node["Resources"]}
    return len(nodes), len(nodes & heads)
