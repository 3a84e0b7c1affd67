"""torchrun's agent, unchanged, without Python's collection at exit.

    python -m trainer.launchers.agent --nnodes=2 --node_rank=0 ... -m trainer.launchers.torchrun --config C

runs `python -m torch.distributed.run` with the same arguments, output and exit status. The one
difference: at interpreter exit, Python collects every object torch's import created, about 2 s of CPU
on a lab core after the run has ended. gc.freeze() moves them out of the collector's reach first, so the
unit ends when the run does. The workers do the same (trainer.launchers._cli.exit_without_final_collection).
And its temporary files go with it: torchrun makes a /tmp/torchelastic_* log directory for every run when no
--log-dir is given and never removes it (one per cell per node, hundreds on a node within days). Here this
process's temporary directory is one of its own, removed when the agent exits; the workers' is untouched.
"""

import gc
import runpy
import tempfile


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="dtlab-agent-") as scratch:
        tempfile.tempdir = scratch  # this process's mkdtemp() calls: torchrun's log directory
        try:
            runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
        finally:
            gc.freeze()


if __name__ == "__main__":
    main()
