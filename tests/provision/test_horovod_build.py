"""scripts/build-horovod-wheel.sh: dtlab's own Horovod build (PyPI's 0.28.1 sdist with the C++ standard
raised to 17) against the pinned torch, and the wheel it leaves. The wheel installs into another venv than
the one it was built in, `horovodrun --check-build` shows PyTorch and Gloo, and two ranks on this machine
average their gradients and all-reduce as they should.

The wheel is kept in the controller's wheelhouse, where the horovod role builds and finds it: a cold run
builds it (about 5 minutes on 2 cores), a warm one only checks it. Needs cmake and g++ for a cold build."""

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dtlab import paths
from dtlab.pins import pinned

SCRIPT = paths.REPO_ROOT / "scripts" / "build-horovod-wheel.sh"
GROUP_VARS = yaml.safe_load((paths.INVENTORY_DIR / "group_vars" / "all.yml").read_text())
HOROVOD_VERSION = GROUP_VARS["horovod_version"]
CLOUDPICKLE = f"cloudpickle=={GROUP_VARS['horovod_cloudpickle_version']}"
# What the build needs in its venv besides torch: Horovod's setup_requires (the build runs without isolation).
BUILD_REQUIREMENTS = [CLOUDPICKLE, "psutil", "pyyaml", "packaging", "cffi", "setuptools>=70.1"]
# The script's one line when the machine cannot compile (setup.sh installs cmake and g++; a machine set up
# otherwise may lack them): those tests skip.
NO_COMPILER = ("build-horovod-wheel: cmake not found", "build-horovod-wheel: no C++ compiler")

# Two ranks: different data each, one model broadcast from rank 0, three SGD steps through Horovod's
# DistributedOptimizer. Rank 0 replays the steps alone with the gradients averaged by hand: Horovod must
# land on the same weights, as DDP would.
JOB = """
import json, torch
import horovod.torch as hvd

hvd.init()
torch.manual_seed(100 + hvd.rank())  # a different start and data on each rank
model = torch.nn.Linear(3, 1)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
start = [p.detach().clone() for p in model.parameters()]
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                     named_parameters=model.named_parameters())
data = torch.randn(8, 3)
for _ in range(3):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(data), data.sum(1, keepdim=True)).backward()
    optimizer.step()

all_data = hvd.allgather(data).view(hvd.size(), 8, 3)
weights = hvd.allgather(model.weight.detach())
replay = torch.nn.Linear(3, 1)
with torch.no_grad():
    for param, value in zip(replay.parameters(), start):
        param.copy_(value)
for _ in range(3):
    grads = []
    for rank_data in all_data:
        replay.zero_grad()
        torch.nn.functional.mse_loss(replay(rank_data), rank_data.sum(1, keepdim=True)).backward()
        grads.append([p.grad.clone() for p in replay.parameters()])
    with torch.no_grad():
        for index, param in enumerate(replay.parameters()):
            param -= 0.05 * sum(g[index] for g in grads) / len(grads)
print(json.dumps({
    "rank": hvd.rank(), "size": hvd.size(),
    "sum": hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item(),
    "average": hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Average).item(),
    "same_weights_on_every_rank": all(torch.equal(weights[0], w) for w in weights),
    "matches_averaged_replay": torch.allclose(model.weight, replay.weight, atol=1e-6),
}), flush=True)
hvd.shutdown()
"""


def run(argv, timeout, **kwargs):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)


def venv_with(directory, requirements):
    """A fresh venv of the controller's Python with the pinned torch and `requirements`."""
    assert run([sys.executable, "-m", "venv", directory], timeout=300).returncode == 0
    python = directory / "bin" / "python"
    # --no-compile, then one import of torch that writes its bytecode: as the roles do, since compiling all
    # of torch's modules costs more than the few this test's processes import (roles/trainer/tasks/venv.yml).
    installed = run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
                     "--find-links", paths.WHEELHOUSE_DIR, "-c", paths.CONSTRAINTS_FILE, "torch",
                     *requirements], timeout=1200)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    warmed = run([python, "-c", "import torch"], timeout=300, env=environment)
    assert warmed.returncode == 0, warmed.stderr[-2000:]
    return python


def missing_compiler(text):
    """The script's line saying that cmake or the C++ compiler is missing, if `text` has it."""
    lines = [line.strip() for line in text.splitlines() if any(mark in line for mark in NO_COMPILER)]
    return lines[0] if lines else None


def build(python, out_dir, *extra, timeout=3900):
    return run([SCRIPT, "--python", python, "--out", out_dir, *extra], timeout=timeout)


@pytest.fixture(scope="module")
def build_python(tmp_path_factory):
    return venv_with(tmp_path_factory.mktemp("horovod-build") / "venv", BUILD_REQUIREMENTS)


@pytest.fixture(scope="module")
def wheel(build_python):
    """The wheel for the pinned torch, in the controller's wheelhouse (built there unless already there)."""
    built = build(build_python, paths.WHEELHOUSE_DIR)
    if built.returncode != 0 and missing_compiler(built.stderr):
        pytest.skip(missing_compiler(built.stderr))
    assert built.returncode == 0, built.stderr[-3000:]
    return built.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def horovod_python(tmp_path_factory, wheel):
    """Another venv than the build's, with the wheel: the extension's RUNPATH names the build venv's torch."""
    return venv_with(tmp_path_factory.mktemp("horovod-run") / "venv", [wheel, CLOUDPICKLE])


@pytest.mark.slow
def test_the_wheel_carries_horovod_torch_and_python_and_is_not_rebuilt(build_python, wheel):
    torch_version = pinned("torch")
    probe = "import sys, torch; print(torch.__version__, 'cp%d%d' % sys.version_info[:2])"
    torch_built, python_tag = run([build_python, "-c", probe], timeout=120).stdout.split()
    assert torch_built.split("+")[0] == torch_version
    label = "torch" + torch_built.replace("+", ".")
    name = f"horovod-{HOROVOD_VERSION}+{label}-{python_tag}-{python_tag}-linux_x86_64.whl"
    assert wheel == f"{paths.WHEELHOUSE_DIR}/{name}"
    started = time.monotonic()
    again = build(build_python, paths.WHEELHOUSE_DIR, timeout=300)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == wheel
    assert "present, not rebuilt" in again.stderr
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_check_build_shows_pytorch_and_gloo_without_mpi(horovod_python):
    checked = run([horovod_python.parent / "horovodrun", "--check-build"], timeout=120)
    assert checked.returncode == 0, checked.stderr
    lines = [line.strip() for line in checked.stdout.splitlines()]
    assert f"Horovod v{HOROVOD_VERSION}+torch" in checked.stdout
    assert "[X] PyTorch" in lines
    assert lines.count("[X] Gloo") == 2  # the controller and the tensor operations
    assert lines.count("[ ] MPI") == 2


@pytest.mark.slow
def test_two_ranks_average_gradients_and_allreduce_on_localhost(horovod_python, tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    ran = run([horovod_python.parent / "horovodrun", "--gloo", "-np", "2", "-H", "localhost:2",
               horovod_python, job], timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    results = sorted((json.loads(line.split(">:", 1)[1]) for line in ran.stdout.splitlines()
                      if line.startswith("[") and ">:{" in line), key=lambda result: result["rank"])
    assert [result["rank"] for result in results] == [0, 1], ran.stdout[-3000:]
    for result in results:
        assert result["size"] == 2
        assert result["sum"] == 3.0  # 1 + 2
        assert result["average"] == 0.5  # (0 + 1) / 2
        assert result["same_weights_on_every_rank"] is True
        assert result["matches_averaged_replay"] is True


@pytest.mark.slow
def test_a_sdist_with_another_checksum_is_refused(build_python, tmp_path):
    fake = tmp_path / f"horovod-{HOROVOD_VERSION}.tar.gz"
    fake.write_bytes(b"not the release")
    refused = build(build_python, tmp_path / "out", "--sdist", fake, timeout=300)
    if missing_compiler(refused.stderr):
        pytest.skip(missing_compiler(refused.stderr))
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("(horovod_sdist_sha256)"), refused.stderr
    assert "not the pinned " + GROUP_VARS["horovod_sdist_sha256"] in refused.stderr
    assert not list((tmp_path / "out").glob("*.whl"))


def test_bad_arguments_are_refused_in_one_line(tmp_path):
    missing = run([SCRIPT, "--python", tmp_path / "nope", "--out", tmp_path], timeout=30)
    assert missing.returncode == 2
    assert missing.stderr == f"build-horovod-wheel: --python {tmp_path / 'nope'} is not an executable\n"
    no_out = run([SCRIPT, "--python", sys.executable], timeout=30)
    assert (no_out.returncode, no_out.stderr) == (
        2, "build-horovod-wheel: --out is required (the directory the wheel goes to)\n")
    no_torch = run([SCRIPT, "--python", "/usr/bin/true", "--out", tmp_path, "--version", "0.28.1",
                    "--sha256", "0" * 64], timeout=30)
    assert no_torch.returncode == 2
    assert no_torch.stderr.startswith("build-horovod-wheel: /usr/bin/true has no torch")


def test_gpu_operations_are_refused_in_one_line_where_they_cannot_be_built(tmp_path):
    """GPU nodes need Horovod's NCCL operations (the trainer hands it CUDA tensors): the script builds them
    only for a CUDA build of torch and for named compute capabilities, and says so before any work."""
    base = [SCRIPT, "--python", sys.executable, "--out", tmp_path]
    refusals = {
        ("--gpu-operations", "NCCL"): "--gpu-operations NCCL needs --cuda-cc-list, compute capabilities like"
                                      " 60,61,90 (got '')",
        ("--gpu-operations", "nccl", "--cuda-cc-list", "61"): "--gpu-operations nccl: give none or NCCL",
        ("--cuda-cc-list", "61"): "--cuda-cc-list is for --gpu-operations NCCL only",
        ("--gpu-operations", "NCCL", "--cuda-cc-list", "6.1"):
            "--gpu-operations NCCL needs --cuda-cc-list, compute capabilities like 60,61,90 (got '6.1')",
    }
    for arguments, said in refusals.items():
        refused = run([*base, *arguments], timeout=30)
        assert (refused.returncode, refused.stderr) == (2, f"build-horovod-wheel: {said}\n"), arguments
    torch_version = importlib.metadata.version("torch")
    assert "+cu" not in torch_version  # this machine's torch is the CPU build
    cpu_torch = run([*base, "--version", "0.28.1", "--sha256", "0" * 64, "--gpu-operations", "NCCL",
                     "--cuda-cc-list", "61,90"], timeout=60)
    said = (f"build-horovod-wheel: --gpu-operations NCCL needs a CUDA build of torch in {sys.executable},"
            f" which has torch {torch_version}\n")
    assert (cpu_torch.returncode, cpu_torch.stderr) == (2, said)
    assert not list(tmp_path.glob("*.whl"))


def test_a_second_build_into_the_same_directory_waits_for_the_first(tmp_path):
    import fcntl

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with open(out_dir / ".horovod-build.lock", "w") as first_build:
        fcntl.flock(first_build, fcntl.LOCK_EX)  # a build in progress
        started = time.monotonic()
        waited = run([SCRIPT, "--python", sys.executable, "--out", out_dir, "--timeout", "2"], timeout=60)
        assert time.monotonic() - started >= 1.5
    assert waited.returncode == 2
    assert waited.stderr == f"build-horovod-wheel: another build held {out_dir}/.horovod-build.lock for 2s\n"
    assert not list(out_dir.glob("*.whl"))


@pytest.mark.slow  # two ansible-playbook runs: not in `invoke test --fast`
def test_the_role_waits_for_a_build_under_way_and_names_a_stuck_one_in_one_line(tmp_path):
    """Before it looks for a wheel, the horovod role waits on the script's lock (its tasks/wait.yml): the
    demo's early build holds it, and its wheel then needs no build venv of the role's own."""
    import fcntl
    import threading

    lock = tmp_path / ".horovod-build.lock"

    def wait(timeout_s):
        settings = {"trainer_controller_wheelhouse_dir": str(tmp_path), "horovod_build_timeout_s": timeout_s}
        return run([paths.REPO_ROOT / ".venv/bin/ansible-playbook", "-i", "localhost,", "-c", "local",
                    "tests/provision/playbooks/horovod_build_wait.yml", "-e", json.dumps(settings)],
                   timeout=120, cwd=paths.REPO_ROOT, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})

    with open(lock, "w") as build:
        fcntl.flock(build, fcntl.LOCK_EX)  # a build under way, done 8 s from now
        threading.Timer(8, fcntl.flock, (build, fcntl.LOCK_UN)).start()
        started = time.monotonic()
        waited = wait(60)
        assert waited.returncode == 0, waited.stdout[-3000:]
        assert time.monotonic() - started >= 8
    with open(lock, "w") as stuck:
        fcntl.flock(stuck, fcntl.LOCK_EX)
        refused = wait(1)
    assert refused.returncode == 2, refused.stdout[-3000:]
    assert f"horovod: another build held {lock} for 1 s; is it stuck?" in refused.stdout


@pytest.mark.slow
def test_another_wheelhouse_copies_the_wheel_from_the_machines_cache(build_python, wheel, tmp_path):
    # A second clone (or a wiped .dtlab) on the same machine: its empty wheelhouse gets the wheel this
    # machine built, keyed by the script's own hash, instead of minutes of compiling.
    env = {**os.environ, "DTLAB_HOROVOD_CACHE": str(tmp_path / "cache")}
    # Keys of older scripts: one unused for 40 days is deleted when a wheel is kept, a recent one stays.
    stale, recent = tmp_path / "cache" / "0000000000000000-old", tmp_path / "cache" / "1111111111111111-new"
    for key_dir in (stale, recent):
        key_dir.mkdir(parents=True)
    month_and_more_ago = time.time() - 40 * 86400
    os.utime(stale, (month_and_more_ago, month_and_more_ago))
    kept = run([SCRIPT, "--python", build_python, "--out", paths.WHEELHOUSE_DIR], timeout=300, env=env)
    assert kept.returncode == 0 and "present, not rebuilt" in kept.stderr, kept.stderr
    key = f"{hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]}-{GROUP_VARS['horovod_sdist_sha256'][:16]}"
    assert (tmp_path / "cache" / key / Path(wheel).name).read_bytes() == Path(wheel).read_bytes()
    assert not stale.exists() and recent.is_dir()
    another = tmp_path / "another-clone"
    copied = run([SCRIPT, "--python", build_python, "--out", another], timeout=300, env=env)
    assert copied.returncode == 0, copied.stderr
    assert "copied from this machine's cache" in copied.stderr and "built in" not in copied.stderr
    assert copied.stdout.splitlines()[-1] == str(another / Path(wheel).name)
    assert Path(copied.stdout.splitlines()[-1]).read_bytes() == Path(wheel).read_bytes()
    # A given sdist that is not the pin gets no cached wheel built from the pin: it is refused as before.
    fake = tmp_path / f"horovod-{HOROVOD_VERSION}.tar.gz"
    fake.write_bytes(b"not the release")
    refused = run([SCRIPT, "--python", build_python, "--out", tmp_path / "third", "--sdist", fake],
                  timeout=300, env=env)
    assert refused.returncode == 2 and "(horovod_sdist_sha256)" in refused.stderr, refused.stderr
    assert not list((tmp_path / "third").glob("*.whl"))


# Where the trainer runs on GPUs: the model on CUDA broadcast from rank 0, and a CUDA tensor all-reduced.
# A build without GPU operations fails at the broadcast ("Requested ReadyEvent with GPU device but not
# compiled with CUDA"), which is what the horovod role's NCCL build and its verify step prevent.
GPU_JOB = """
import json, torch
import horovod.torch as hvd

hvd.init()
torch.cuda.set_device(hvd.local_rank())
model = torch.nn.Linear(4, 2).cuda()
torch.nn.init.constant_(model.weight, float(hvd.rank()))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
total = hvd.allreduce(torch.full((3,), float(hvd.rank() + 1), device="cuda"), op=hvd.Sum)
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "nccl": hvd.nccl_built(),
                  "weights": float(model.weight.sum()), "sum": total.tolist(), "device": total.device.type}))
"""


@pytest.mark.slow
def test_a_nccl_build_broadcasts_and_allreduces_cuda_tensors(tmp_path):
    """Guarded: runs only where this Python's torch is a CUDA build that sees a GPU, with the CUDA toolkit
    and the build's requirements (a lent GPU machine); skipped, saying why, everywhere else."""
    capability = "''.join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else 0"
    probe = run([sys.executable, "-c", f"import torch; print(torch.__version__, torch.version.cuda,"
                 f" torch.cuda.device_count(), {capability})"], timeout=300)
    version, cuda, gpus, capability = probe.stdout.split()
    if cuda == "None" or int(gpus) == 0:
        pytest.skip(f"CUDA: needs torch's CUDA build and a GPU (this Python: torch {version}, {gpus} GPUs)")
    built = build(sys.executable, tmp_path / "out", "--gpu-operations", "NCCL", "--cuda-cc-list", capability)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = built.stdout.splitlines()[-1]
    assert f".nccl.cc{capability}-" in wheel
    venv = tmp_path / "run"
    assert run([sys.executable, "-m", "venv", "--system-site-packages", venv], timeout=300).returncode == 0
    installed = run([venv / "bin/python", "-m", "pip", "install", "--quiet", "--no-deps", wheel], timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    checked = run([venv / "bin/horovodrun", "--check-build"], timeout=120)
    assert "[X] NCCL" in [line.strip() for line in checked.stdout.splitlines()], checked.stdout
    job = tmp_path / "gpu_job.py"
    job.write_text(GPU_JOB)
    ranks = min(int(gpus), 2)
    ran = run([venv / "bin/horovodrun", "--gloo", "-np", ranks, "-H", f"localhost:{ranks}",
               venv / "bin/python", job], timeout=600, cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    results = [json.loads(line.split(">:", 1)[1]) for line in ran.stdout.splitlines() if ">:{" in line]
    assert sorted(result["rank"] for result in results) == list(range(ranks)), ran.stdout[-3000:]
    for result in results:
        assert result["nccl"] and result["device"] == "cuda" and result["size"] == ranks
        assert result["weights"] == 0.0  # rank 0's zeros, broadcast over the GPU operations
        assert result["sum"] == [float(sum(range(1, ranks + 1)))] * 3
