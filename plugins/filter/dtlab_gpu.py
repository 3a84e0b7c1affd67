"""Filter dtlab_torch_build: the CUDA build of torch for the cluster's GPUs, chosen by dtlab.gpucompat.

The data (dtlab/data/gpu_compat.yml) and the rule live in dtlab's own Python, so Ansible and the harness
choose alike. In a role:

    "{{ nodes | dtlab_torch_build(nvidia_driver_branch, dtlab_torch_build) }}"

nodes: one [host, gpu names, compute capabilities, GPU count] per node (a node without a GPU: [], [], 0).
Returns {name, pip_args, index_url, cuda, summary, error, pending}:
- name "pypi" with empty pip_args: the main index's own torch (no GPU anywhere, or dtlab_torch_build pypi);
- error: dtlab's one line where no build runs some GPU (the role fails with it);
- pending: hosts with GPUs on the PCI bus whose driver does not answer yet (capability unknown); with
  dtlab_torch_build auto that is an error too, which a check-mode run only reports.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _node(entry):
    if isinstance(entry, dict):
        return (entry["host"], entry.get("names") or [], entry.get("capabilities") or [],
                entry.get("count", len(entry.get("capabilities") or [])))
    host, names, capabilities, count = entry
    return host, names or [], capabilities or [], count


def dtlab_torch_build(nodes, driver_branch, requested="auto"):
    if str(REPO_ROOT) not in sys.path:  # this checkout's dtlab, also where the venv has another
        sys.path.insert(0, str(REPO_ROOT))
    from dtlab import gpucompat
    from dtlab.errors import DtlabError

    result = {"name": gpucompat.PYPI, "pip_args": "", "index_url": "", "cuda": "", "summary": "",
              "error": "", "pending": []}
    node_gpus = []
    for host, names, capabilities, count in map(_node, nodes):
        if int(count or 0) > len(capabilities):
            result["pending"].append(str(host))
        node_gpus.append(gpucompat.NodeGpus(host=str(host), names=tuple(str(n) for n in names),
                                            capabilities=tuple(str(c) for c in capabilities)))
    try:
        compat = gpucompat.load()
        if result["pending"] and str(requested) == gpucompat.AUTO:
            raise DtlabError(
                f"{result['pending'][0]}: NVIDIA GPU on the PCI bus but no compute capability from "
                "nvidia-smi (driver not loaded yet: reboot pending?); reboot it and run "
                "`ansible-playbook site.yml --tags nvidia`, or pin dtlab_torch_build (e.g. cu126)")
        build = compat.choose(node_gpus, driver_branch, str(requested))
    except DtlabError as error:
        return {**result, "name": "", "error": str(error)}
    if build is None:
        return {**result, "summary": f"torch {compat.torch} from the main index (no extra index)"}
    return {**result, "name": build.name, "pip_args": build.pip_args, "index_url": build.index_url,
            "cuda": build.cuda, "summary": f"torch {compat.torch} {build.describe()} from {build.index_url}"}


class FilterModule:
    def filters(self):
        return {"dtlab_torch_build": dtlab_torch_build}
