"""trainer.deploy: push the trainer code to every node, check the environments match, build the image.

The code goes over Fabric's sftp as one tarball per node and replaces dtlab_code_dir in one rename, so
a node never has half a trainer. Where dtlab_trainer_runtime is docker, the study's trainer image (Listing
4.1) is rebuilt on each worker from the trainer role's Dockerfile; the code itself is mounted at /app. With
an offline bundle (dtlab_bundle) nothing can be built (no base image, no package index): the trainer role
loaded the bundle's image, and each worker is only asked that it has it.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import tempfile
from pathlib import Path

from dtlab import paths, remote
from dtlab.errors import DtlabError
from dtlab.inventory import Cluster, Node
from dtlab.probes import node_versions

PACKAGES = ("trainer",)
EXTRA_FILES = ("constraints.txt",)
REVISION_FILE = "DTLAB_REVISION"
def bundle() -> tuple[bytes, str]:
    """The trainer as a .tar.gz (no caches) and its content digest."""
    buffer = io.BytesIO()
    digest = hashlib.sha256()
    files = [
        p
        for package in PACKAGES
        for p in sorted((paths.REPO_ROOT / package).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc",)
    ]
    files += [paths.REPO_ROOT / name for name in EXTRA_FILES if (paths.REPO_ROOT / name).is_file()]
    for path in files:
        digest.update(str(path.relative_to(paths.REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in files:
            info = archive.gettarinfo(str(path), arcname=str(path.relative_to(paths.REPO_ROOT)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o644
            with path.open("rb") as handle:
                archive.addfile(info, handle)
        revision = digest.hexdigest()[:16].encode()
        info = tarfile.TarInfo(REVISION_FILE)
        info.size = len(revision)
        archive.addfile(info, io.BytesIO(revision))
    return buffer.getvalue(), digest.hexdigest()[:16]


def push(cluster: Cluster, node: Node, archive: Path, revision: str) -> str:
    code = cluster.code_dir
    upload = f"/tmp/dtlab-trainer-{revision}.tar.gz"
    remote.put_file(node, archive, upload)
    new, old = f"{code}.new", f"{code}.old"
    command = (
        f"set -e; rm -rf {shlex.quote(new)} {shlex.quote(old)}; mkdir -p {shlex.quote(new)}; "
        f"tar -xzf {shlex.quote(upload)} -C {shlex.quote(new)} --no-same-owner; rm -f {shlex.quote(upload)}; "
        # Bytecode now, as root: the trainer user cannot write __pycache__ here, so every trainer
        # process would compile the code again; -d names the final path in tracebacks.
        f"{shlex.quote(cluster.python)} -m compileall -q -d {shlex.quote(code)} {shlex.quote(new)} "
        ">/dev/null || true; "
        f"chmod -R a+rX {shlex.quote(new)}; "
        f"if [ -d {shlex.quote(code)} ]; then mv {shlex.quote(code)} {shlex.quote(old)}; fi; "
        f"mv {shlex.quote(new)} {shlex.quote(code)}; rm -rf {shlex.quote(old)}; "
        f"cat {shlex.quote(code + '/' + REVISION_FILE)}"
    )
    answer = remote.run(node, command, timeout=120)
    if not answer.ok or answer.stdout.strip() != revision:
        raise DtlabError(
            f"host {node.name}: trainer.deploy failed: {(answer.stderr or answer.stdout).strip()[-200:]}"
        )
    return revision


def build_image(cluster: Cluster, node: Node) -> None:
    """Rebuild the trainer image from the Dockerfile the trainer role put in <dtlab_root>/docker."""
    context = f"{cluster.require('dtlab_root')}/docker"
    command = (
        f"test -f {shlex.quote(context)}/Dockerfile || {{ echo 'no {context}/Dockerfile: run "
        f"ansible-playbook site.yml --tags trainer'; exit 3; }}; "
        f"docker build -q -t {shlex.quote(cluster.trainer_image)} {shlex.quote(context)}"
    )
    answer = remote.run(node, command, timeout=1800)
    if not answer.ok:
        raise DtlabError(
            f"host {node.name}: docker build of {cluster.trainer_image} failed: "
            f"{(answer.stderr or answer.stdout).strip()[-200:]}"
        )


def require_image(node: Node, image: str) -> None:
    """The offline bundle's image, which the trainer role loads (docs/offline.md), is on the node."""
    answer = remote.run(node, f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}", timeout=60)
    if not answer.ok:
        raise DtlabError(
            f"host {node.name}: no docker image {image}; with the offline bundle the trainer role loads it"
            " from the bundle's images/ (ansible-playbook site.yml --tags trainer; docs/offline.md)"
        )


def deploy(cluster: Cluster, say=print) -> dict[str, object]:
    """Push, verify identical environments, build the image where chosen; one line per problem."""
    data, revision = bundle()
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as handle:
        handle.write(data)
        handle.flush()
        answers = remote.fan_out(cluster.nodes, lambda node: push(cluster, node, Path(handle.name), revision))
    problems = [f"{name}: {answer}" for name, answer in answers.items() if isinstance(answer, BaseException)]
    if problems:
        raise DtlabError(f"trainer.deploy: {'; '.join(problems)}")
    say(f"trainer {revision} pushed to {cluster.code_dir} on {', '.join(answers)}")

    versions = node_versions(cluster)
    broken = {name: v["error"] for name, v in versions.items() if "error" in v}
    if broken:
        name, error = next(iter(broken.items()))
        raise DtlabError(
            f"trainer.deploy: host {name}: trainer env at {cluster.venv_dir} unusable ({error}); "
            "run ansible-playbook site.yml --tags trainer"
        )
    distinct = {tuple(sorted(v.items())) for v in versions.values()}
    if len(distinct) > 1:
        first = next(iter(versions))
        differing = [n for n, v in versions.items() if v != versions[first]]
        raise DtlabError(
            f"trainer.deploy: trainer env differs between {first} and {', '.join(differing)}: "
            f"{versions[first]} vs {versions[differing[0]]}; re-run ansible-playbook site.yml --tags trainer"
        )
    sample = next(iter(versions.values()))
    say(
        f"identical trainer env on {len(versions)} nodes: python {sample.get('python')}, "
        f"torch {sample.get('torch')}, "
        f"transformers {sample.get('transformers')}, freeze {sample.get('freeze_sha')}"
    )

    if cluster.trainer_runtime == "docker":
        offline = bool(cluster.var("dtlab_bundle", ""))
        failures = remote.fan_out(cluster.workers, lambda node: require_image(node, cluster.trainer_image)
                                  if offline else build_image(cluster, node))
        problems = [str(a) for a in failures.values() if isinstance(a, BaseException)]
        if problems:
            raise DtlabError(problems[0])
        where = "from the offline bundle, on" if offline else "built on"
        say(f"docker image {cluster.trainer_image} {where} {', '.join(n.name for n in cluster.workers)}")
    return {"revision": revision, "versions": versions}
