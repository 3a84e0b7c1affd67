"""Which CUDA build of the pinned torch a cluster's GPUs can run, from dtlab/data/gpu_compat.yml.

The data file is the one place for the facts (builds, their architectures and minimum driver branches,
GPU generations); this module is the one place for the rule. Ansible asks it through
plugins/filter/dtlab_gpu.py (roles nvidia and trainer), so both sides choose alike:

    build = gpucompat.load().choose([NodeGpus("node1", ("GTX 1060",), ("6.1",))], driver_branch=535)
    build.name, build.pip_args   # 'cu126', '--extra-index-url https://download.pytorch.org/whl/cu126'

A build runs on a GPU of compute capability X.y when it carries machine code for X.z with z <= y
(same major), or PTX for a capability <= X.y (NVIDIA's binary and PTX compatibility rules).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from dtlab.errors import DtlabError

DATA_FILE = Path(__file__).resolve().parent / "data" / "gpu_compat.yml"
# The inventory's dtlab_torch_build: choose from the data, or take the main index's own build.
AUTO = "auto"
PYPI = "pypi"


def capability(text: str) -> tuple[int, int]:
    """'6.1' -> (6, 1); one clear line for anything else."""
    major, _, minor = str(text).strip().partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise DtlabError(f"compute capability {text!r}: not of the form MAJOR.MINOR (e.g. 6.1)")
    return int(major), int(minor)


def code_runs_on(gpu: tuple[int, int], code: tuple[int, int], kind: str) -> bool:
    """NVIDIA's binary compatibility, the one rule for the data here and torch's arch list
    (cluster.check): machine code ("sass") for X.y runs on X.z with z >= y; architecture-specific
    machine code ("sass-a", sm_XYa) only on X.y itself; PTX for X.y is compiled by the driver for any
    capability >= X.y."""
    if kind == "ptx":
        return code <= gpu
    if kind == "sass-a":
        return code == gpu
    return code[0] == gpu[0] and code[1] <= gpu[1]


@dataclass(frozen=True)
class Build:
    name: str
    cuda: str
    status: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    min_driver_branch: int
    index_url: str

    def supports(self, gpu_capability: str) -> bool:
        gpu = capability(gpu_capability)
        return any(code_runs_on(gpu, capability(c), "sass") for c in self.sass) or any(
            code_runs_on(gpu, capability(c), "ptx") for c in self.ptx)

    @property
    def pip_args(self) -> str:
        """The extra index for this build; the main index stays (transformers, pyspark, determined)."""
        return f"--extra-index-url {self.index_url}"

    def describe(self) -> str:
        newest = self.sass[-1] + ("+PTX" if self.ptx else "")
        return (f"{self.name} (CUDA {self.cuda}, compute capability {self.sass[0]}-{newest}, "
                f"driver >= {self.min_driver_branch})")


@dataclass(frozen=True)
class NodeGpus:
    """One node's NVIDIA GPUs: their names and compute capabilities (from nvidia-smi)."""

    host: str
    names: tuple[str, ...]
    capabilities: tuple[str, ...]

    def gpu(self, index: int) -> str:
        return self.names[index] if index < len(self.names) else "NVIDIA GPU"


@dataclass(frozen=True)
class GpuCompat:
    torch: str
    pypi_build: str
    builds: tuple[Build, ...]
    generations: tuple[dict, ...]
    peaks: tuple[dict, ...] = ()  # dense TFLOPS per GPU model and type (the data file's `peaks`)

    def declared_peak(self, gpu_name: str, precision: str) -> tuple[float, str] | None:
        """(FLOPs per second, its source) of one GPU computing in `precision` (fp32, fp16 or bf16): the
        first `peaks` entry named in `gpu_name`; None where none is, or it declares no such type."""
        for peak in self.peaks:
            if peak["name"] in gpu_name:
                tflops = peak.get(precision)
                if not tflops:
                    return None
                return float(tflops) * 1e12, f"{peak['name']} {precision}, {peak['source']}"
        return None

    def build(self, name: str) -> Build:
        for build in self.builds:
            if build.name == name:
                return build
        known = ", ".join([AUTO, PYPI, *(b.name for b in self.builds)])
        raise DtlabError(f"dtlab_torch_build {name!r}: not a torch {self.torch} build; use one of {known}")

    def generation(self, gpu_capability: str) -> dict:
        wanted = capability(gpu_capability)
        for generation in self.generations:
            if wanted in {capability(c) for c in generation["capabilities"]}:
                return generation
        return {"name": "unknown generation", "last_driver_branch": None}

    def options(self) -> str:
        return "; ".join(build.describe() for build in self.builds)

    def choose(self, nodes: Sequence[NodeGpus], driver_branch: int | str,
               requested: str = AUTO) -> Build | None:
        """The build every node's GPUs run with this driver branch; None where no node has a GPU or the
        inventory asks for the main index's build. A GPU nothing fits is refused in one line."""
        branch = _branch(driver_branch)
        gpus = [(node, index, cap) for node in nodes for index, cap in enumerate(node.capabilities)]
        for node, index, cap in gpus:
            last = self.generation(cap)["last_driver_branch"]
            if last is not None and branch > last:
                raise DtlabError(
                    f"{node.host}: GPU '{node.gpu(index)}' (compute capability {cap}, "
                    f"{self.generation(cap)['name']}) is not supported by driver branch {branch} "
                    f"(nvidia_driver_branch; its last branch is {last}); set nvidia_driver_branch <= {last}")
        if not gpus:
            return None
        if requested == PYPI:
            self._require(self.build(self.pypi_build), gpus, branch,
                          f"dtlab_torch_build {PYPI} (the main index's {self.pypi_build})")
            return None
        if requested != AUTO:
            build = self.build(requested)
            self._require(build, gpus, branch, f"dtlab_torch_build {requested}")
            return build
        for build in self.builds:
            if build.min_driver_branch <= branch and all(build.supports(cap) for _, _, cap in gpus):
                return build
        for node, index, cap in gpus:
            fitting = [build for build in self.builds if build.supports(cap)]
            where = (f"{node.host}: GPU '{node.gpu(index)}' (compute capability {cap}, "
                     f"{self.generation(cap)['name']})")
            if not fitting:
                raise DtlabError(f"{where} is run by no torch {self.torch} CUDA build; "
                                 f"options: {self.options()}")
            if all(build.min_driver_branch > branch for build in fitting):
                raise DtlabError(f"{where}: its torch {self.torch} builds need a newer driver than branch "
                                 f"{branch} (nvidia_driver_branch); options: {self.options()}")
        raise DtlabError(f"no torch {self.torch} CUDA build runs every node's GPUs on driver branch {branch} "
                         f"({', '.join(sorted({cap for _, _, cap in gpus}))}); options: {self.options()}")

    def _require(self, build: Build, gpus: list, branch: int, what: str) -> None:
        for node, index, cap in gpus:
            if not build.supports(cap):
                raise DtlabError(
                    f"{node.host}: {what} has no code for GPU '{node.gpu(index)}' "
                    f"(compute capability {cap}, {self.generation(cap)['name']}); options: {self.options()}")
        if build.min_driver_branch > branch:
            raise DtlabError(
                f"{what} needs driver branch >= {build.min_driver_branch}, "
                f"the inventory's nvidia_driver_branch is {branch}; options: {self.options()}")


def _branch(driver_branch: int | str) -> int:
    text = str(driver_branch).strip()
    if not text.isdigit():
        raise DtlabError(f"nvidia_driver_branch {driver_branch!r}: not a driver branch number (e.g. \"535\")")
    return int(text)


@functools.cache
def load(path: Path = DATA_FILE) -> GpuCompat:
    """Read and check the data file; a malformed one is refused in one line naming the file."""
    try:
        raw = yaml.safe_load(path.read_text())
        base = raw["wheel_index_base"].rstrip("/")
        builds = tuple(
            Build(name=b["name"], cuda=str(b["cuda"]), status=b["status"],
                  sass=tuple(str(c) for c in b["sass"]), ptx=tuple(str(c) for c in b["ptx"]),
                  min_driver_branch=int(b["min_driver_branch"]), index_url=f"{base}/{b['name']}")
            for b in raw["builds"])
        compat = GpuCompat(torch=str(raw["torch"]), pypi_build=raw["pypi_build"], builds=builds,
                           generations=tuple(raw["generations"]), peaks=tuple(raw.get("peaks") or ()))
        for build in builds:  # every capability parses
            for cap in (*build.sass, *build.ptx):
                capability(cap)
        compat.build(compat.pypi_build)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as error:
        raise DtlabError(f"{path}: not a usable GPU compatibility file ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else error!r})") from None
    return compat
