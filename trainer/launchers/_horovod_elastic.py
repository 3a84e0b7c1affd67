"""Horovod Elastic around the core: the horovod launcher's path for `elastic: true` (a fault plan's
`recovery: elastic`), under `horovodrun --min-np 1 --max-np N`.

When a rank is lost, the survivors' next collective fails: Horovod's own (the gradients' all-reduce) with
HorovodInternalError, or the core's torch group (metrics, checkpoints) with Gloo's "connection closed",
which is raised here as HorovodInternalError too. hvd.elastic.run then resets Horovod (shutdown, and init
with the ranks horovodrun still has: it blacklists the lost rank's host) and calls the core again, which
forms a new torch group and resumes its latest checkpoint on fewer ranks (cfg.elastic: the full state fits
any world size). So the state Horovod syncs at a reset holds nothing: the core's checkpoints are the
state, as under torchrun's elastic restart, and the two modes lose the same work.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import horovod.torch as hvd
import torch.distributed as dist
from horovod.common.exceptions import HorovodInternalError

from trainer.core import TrainHooks, train


def peer_lost(error: BaseException) -> bool:
    """Whether a torch collective failed because another rank is gone (Gloo raises a plain RuntimeError
    that names its own source file, e.g. gloo/transport/tcp/pair.cc: "Connection closed by peer")."""
    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and "/gloo/" in str(error))


def run(cfg, make_hooks: Callable[[], TrainHooks], group_env: Callable[[], dict[str, str]]) -> dict | None:
    """train(cfg) on the ranks there are, again after each reset; group_env() gives the torch group's env://
    for the ranks of now (a collective of Horovod's, so it runs inside the elastic function)."""
    state = hvd.elastic.TorchState()  # nothing in it: the core's checkpoint is what the survivors resume

    @hvd.elastic.run
    def train_on_the_ranks_there(state):
        os.environ.update(group_env())
        try:
            return train(cfg, make_hooks())
        except HorovodInternalError:
            raise
        except Exception as error:
            if not peer_lost(error):
                raise
            raise HorovodInternalError(f"a rank was lost in the core's torch group: {error}") from error

    return train_on_the_ranks_there(state)
