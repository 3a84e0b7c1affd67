"""The Determined master as the harness talks to it: user admin, with the password the master was given.

The determined_master role writes `security.initial_user_password: {{ determined_admin_password }}` into
master.yaml; that variable is the generated secret whose file is `determined_admin_password_file`
(inventory/group_vars/all.yml). The harness reads that same file, never a password of its own.

    from dtlab.platforms.determined import master as detmaster
    det = detmaster.connect(cluster)      # a logged-in determined.experimental.client.Determined
    det.list_experiments()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtlab.errors import DtlabError
from dtlab.inventory import Cluster

ADMIN_USER = "admin"


def master_port(cluster: Cluster) -> int:
    return int(cluster.require("determined_master_port"))


def master_url(cluster: Cluster) -> str:
    if cluster.master is None:
        raise DtlabError(f"{cluster.inventory_path}: no master host, so no Determined master")
    return f"http://{cluster.master.address}:{master_port(cluster)}"


def admin_password_file(cluster: Cluster) -> Path:
    return Path(str(cluster.require("determined_admin_password_file")))


def admin_password(cluster: Cluster) -> str:
    """The admin password the master was configured with (the file Ansible's password lookup wrote)."""
    path = admin_password_file(cluster)
    try:
        words = path.read_text().split()  # the lookup may append " salt=..." after the password
    except FileNotFoundError:
        raise DtlabError(
            f"determined: no admin password at {path}; `ansible-playbook site.yml` generates it and gives it"
            " to the master (with the password in a vault, write it to that file, mode 0600)"
        ) from None
    except OSError as error:
        raise DtlabError(f"determined: cannot read the admin password {path}: {error.strerror}") from None
    if not words:
        raise DtlabError(f"determined: the admin password file {path} is empty; delete it and run"
                         " `ansible-playbook site.yml --tags determined` to generate a new one")
    return words[0]


def connect(cluster: Cluster) -> Any:
    """A Determined client logged in as admin. An explicit client object, not client.login(): the SDK's
    login() may be called only once per process, and bench runs one experiment per cell."""
    from determined.experimental import client

    from dtlab.guard import assert_safe_target

    url = master_url(cluster)
    assert cluster.master is not None
    assert_safe_target(cluster.master.address)
    password = admin_password(cluster)
    try:
        return client.Determined(master=url, user=ADMIN_USER, password=password)
    except Exception as error:  # the SDK raises its own types (credentials, master not found, TLS)
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise DtlabError(f"determined: cannot log in as {ADMIN_USER} at {url}:"
                         f" {type(error).__name__}{': ' + detail if detail else ''}") from None


def agents(cluster: Cluster) -> list[dict[str, Any]]:
    """The agents the master knows, as its REST API gives them (GET /api/v1/agents, what `det slot list`
    reads): [{"id": ..., "slots": {...: {"device": {"type": "TYPE_CUDA", ...}, "enabled": ...}}}, ...]."""
    from determined.common.api import bindings

    det = connect(cluster)
    try:
        answer = bindings.get_GetAgents(det._session)  # the SDK's own session, as its CLI uses it
    except Exception as error:  # the SDK raises its own types
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DtlabError(f"determined: cannot list the agents at {master_url(cluster)}: {detail}") from None
    return list(answer.to_json().get("agents") or [])
