"""Before an attempt's units start: preflight (every node the cell needs answers and has the trainer env,
no other cell runs there, the platform's services are up) and prepare (stale units of the cell stopped,
its folders and checkpoints made ready)."""

from __future__ import annotations

import shlex

from dtlab import launch as launching
from dtlab import platforms, remote
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster
from dtlab.platforms import PreflightError


class PrepareStep:
    """Bench's preflight and prepare step, mixed into Bench (which sets these attributes)."""

    cluster: Cluster
    sessions: remote.Sessions | None

    def preflight(self, planned: launching.Launch) -> None:
        """Each node the cell needs answers and has the trainer env; needed services are up."""
        cluster = self.cluster
        shared = cluster.shared_checkpoint_dir
        shared_check = "" if not shared else (
            f"test -d {shlex.quote(shared)} || {{ echo '{shared} (dtlab_shared_checkpoint_dir) is missing: "
            "mount it on every node, or set it to \"\" to keep checkpoints on each node'; exit 3; }; ")
        check = (
            f"test -x {cluster.python} || {{ echo 'no trainer venv at {cluster.venv_dir}'; exit 3; }}; "
            f"test -f {cluster.code_dir}/trainer/core.py || "
            f"{{ echo 'no trainer code in {cluster.code_dir} (run invoke trainer.deploy)'; exit 3; }}; "
            "command -v systemd-run >/dev/null || { echo 'no systemd-run'; exit 3; }; "
            # The units read gloo's and NCCL's interface from it; without it they would not start.
            f"test -s {shlex.quote(cluster.socket_env_file)} || {{ echo 'no {cluster.socket_env_file} (the "
            "interface for gloo and NCCL): run ansible-playbook site.yml'; exit 3; }; "
            + shared_check
            # Another cell still running here would share the node and skew both measurements.
            + "echo running=$(systemctl list-units --plain --no-legend --state=active,activating "
            + " ".join(shlex.quote(p + ".service") for p in remote.CELL_UNIT_PATTERNS)
            + " | awk '{print $1}' | tr '\\n' ' ')"
        )
        own_prefix = remote.unit_name(planned.cell.key, "")
        answers = remote.run_all(planned.all_nodes, check, timeout=30, sessions=self.sessions)
        for name, answer in answers.items():
            if isinstance(answer, BaseException):
                raise PreflightError(f"preflight: {answer}", name)
            if not answer.ok:
                raise PreflightError(
                    f"preflight: host {name}: {(answer.stdout or answer.stderr).strip()}", name
                )
            running = answer.stdout.rpartition("running=")[2].split()
            others = [unit for unit in running if not unit.startswith(own_prefix)]
            if others:
                raise PreflightError(
                    f"preflight: host {name}: another cell is still running ({others[0]}); wait for it or "
                    "run `invoke cluster.reset`",
                    name,
                )
        try:  # the platform's own readiness (its workers alive, its queue idle, its image usable)
            platforms.get(planned.cell.framework).preflight(cluster, planned, self.sessions)
        except PreflightError:
            raise
        except DtlabError as error:
            raise PreflightError(f"preflight: {error}", getattr(error, "node", None)) from None

    def prepare(self, planned: launching.Launch, *, fresh: bool) -> None:
        # A unit of this very cell left by a controller that died would block the unit name: stop it.
        stale = shlex.quote(remote.unit_name(planned.cell.key, "*") + ".service")
        command = (
            f"systemctl stop {stale} 2>/dev/null; systemctl reset-failed {stale} 2>/dev/null; "
            + launching.prepare_command(planned, self.cluster.user, fresh=fresh)
        )
        answers = remote.run_all(planned.prepare_nodes, command, timeout=60, sessions=self.sessions)
        shared = launching.shared_checkpoint_command(planned, self.cluster.user, fresh=fresh)
        if shared is not None:  # after the stale units are stopped everywhere
            first = planned.placement.nodes[0]
            answers[first.name] = remote.run(first, shared, timeout=60, sessions=self.sessions)
        for name, answer in answers.items():
            if isinstance(answer, BaseException):
                raise DtlabError(f"host {name}: cannot prepare the cell: {answer}")
            if not answer.ok:
                raise DtlabError(
                    f"host {name}: cannot prepare the cell: {(answer.stderr or answer.stdout).strip()}"
                )
