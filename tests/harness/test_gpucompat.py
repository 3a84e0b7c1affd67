"""The GPU compatibility data (dtlab/data/gpu_compat.yml) and the rule that picks torch's CUDA build."""

import pytest
import yaml

from dtlab import gpucompat, paths
from dtlab.errors import DtlabError
from dtlab.gpucompat import NodeGpus
from dtlab.pins import pinned

GTX_1060 = NodeGpus("node1", ("NVIDIA GeForce GTX 1060 3GB",), ("6.1",))


@pytest.fixture(scope="module")
def compat():
    return gpucompat.load()


def test_the_data_is_for_the_pinned_torch(compat):
    major, minor, *_ = pinned("torch").split(".")
    assert compat.torch == f"{major}.{minor}", "bump dtlab/data/gpu_compat.yml with the torch pin"


def test_each_build_installs_from_its_own_extra_index_keeping_the_main_one(compat):
    for build in compat.builds:
        assert build.pip_args == f"--extra-index-url https://download.pytorch.org/whl/{build.name}"
        assert "--index-url" not in build.pip_args.replace("--extra-index-url", "")


@pytest.mark.parametrize(("gpu_capability", "builds"), [
    ("5.0", ["cu126"]), ("5.2", ["cu126"]),                      # Maxwell: machine code for 5.0
    ("6.0", ["cu126"]), ("6.1", ["cu126"]),                      # Pascal: the study's GTX 1060 is 6.1
    ("7.0", ["cu126"]),                                           # Volta
    ("7.5", ["cu130", "cu126", "cu132"]), ("8.6", ["cu130", "cu126", "cu132"]),
    ("8.9", ["cu130", "cu126", "cu132"]),                        # Ada: sm_86 code runs on 8.9
    ("9.0", ["cu130", "cu126", "cu132"]),
    ("10.0", ["cu130", "cu132"]), ("12.0", ["cu130", "cu132"]),   # Blackwell: CUDA 13 only
    ("12.1", ["cu130", "cu132"]),                                 # sm_120 code and 12.0 PTX run on 12.1
    ("3.7", []),                                                  # Kepler: no build at all
])
def test_which_builds_run_a_capability(compat, gpu_capability, builds):
    assert [b.name for b in compat.builds if b.supports(gpu_capability)] == builds


def test_the_reference_cluster_gets_cu126_on_the_inventorys_driver_branch(compat):
    """group_vars/all.yml's nvidia_driver_branch (580): Pascal's last branch, and cu126 still runs it."""
    group_vars = yaml.safe_load((paths.INVENTORY_DIR / "group_vars" / "all.yml").read_text())
    branch = group_vars["nvidia_driver_branch"]
    build = compat.choose([GTX_1060, NodeGpus("node0", ("GTX 1060",), ("6.1",))], driver_branch=branch)
    assert (branch, build.name) == ("580", "cu126")
    assert compat.generation("6.1")["last_driver_branch"] == int(branch)  # never past it for Pascal


def test_the_study_cluster_gets_cu126_on_driver_535(compat):
    nodes = [GTX_1060, NodeGpus("node0", ("GTX 1060",), ("6.1",)), NodeGpus("node2", (), ())]
    build = compat.choose(nodes, driver_branch="535")
    assert build.name == "cu126" and build.min_driver_branch == 525


def test_the_driver_branch_rules_out_cuda_13_builds(compat):
    turing = [NodeGpus("node1", ("Tesla T4",), ("7.5",))]
    assert compat.choose(turing, 535).name == "cu126"
    assert compat.choose(turing, 580).name == "cu130"  # the stable CUDA 13 build, before experimental


def test_no_gpu_or_pypi_means_the_main_index(compat):
    assert compat.choose([NodeGpus("node1", (), ())], 535) is None
    assert compat.choose([NodeGpus("node1", ("T4",), ("7.5",))], 580, gpucompat.PYPI) is None


def test_a_gpu_no_build_runs_is_refused_in_one_line_naming_gpu_capability_and_options(compat):
    with pytest.raises(DtlabError) as refused:
        compat.choose([NodeGpus("node1", ("Tesla K80",), ("3.7",))], 470)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("node1: GPU 'Tesla K80' (compute capability 3.7, Kepler)")
    assert "cu126 (CUDA 12.6.3, compute capability 5.0-9.0, driver >= 525)" in message
    assert "cu130 (CUDA 13.0.2, compute capability 7.5-12.0+PTX, driver >= 580)" in message


def test_a_blackwell_gpu_on_driver_535_is_told_it_needs_a_newer_driver(compat):
    with pytest.raises(DtlabError, match=r"GPU 'RTX 5090' \(compute capability 12.0, Blackwell\): "
                                         r"its torch 2.13 builds need a newer driver than branch 535"):
        compat.choose([NodeGpus("node1", ("RTX 5090",), ("12.0",))], 535)


def test_a_pinned_or_pypi_build_that_cannot_run_pascal_is_refused(compat):
    with pytest.raises(DtlabError, match=r"node1: dtlab_torch_build cu130 has no code for GPU "
                                         r"'NVIDIA GeForce GTX 1060 3GB' \(compute capability 6.1, Pascal\)"):
        compat.choose([GTX_1060], 580, "cu130")
    with pytest.raises(DtlabError, match=r"dtlab_torch_build pypi \(the main index's cu130\) has no code"):
        compat.choose([GTX_1060], 580, gpucompat.PYPI)
    with pytest.raises(DtlabError, match=r"dtlab_torch_build cu130 needs driver branch >= 580"):
        compat.choose([NodeGpus("node1", ("T4",), ("7.5",))], 535, "cu130")
    with pytest.raises(DtlabError, match=r"dtlab_torch_build 'cu999': not a torch 2.13 build; use one of"):
        compat.choose([GTX_1060], 535, "cu999")


def test_mixed_gpus_need_one_build_for_all(compat):
    mixed = [GTX_1060, NodeGpus("node2", ("B200",), ("10.0",))]
    with pytest.raises(DtlabError,
                       match=r"no torch 2.13 CUDA build runs every node's GPUs on driver branch 580"):
        compat.choose(mixed, 580)
    assert compat.choose([GTX_1060, NodeGpus("node2", ("A100",), ("8.0",))], 580).name == "cu126"


def test_pascal_is_refused_on_a_driver_branch_past_its_last(compat):
    with pytest.raises(DtlabError, match=r"not supported by driver branch 590 .*its last branch is 580"):
        compat.choose([GTX_1060], 590)


def test_bad_driver_branch_and_capability_are_one_line_errors(compat):
    with pytest.raises(DtlabError, match=r"nvidia_driver_branch '535-server': not a driver branch number"):
        compat.choose([GTX_1060], "535-server")
    with pytest.raises(DtlabError, match=r"compute capability 'sm_61': not of the form MAJOR.MINOR"):
        compat.choose([NodeGpus("node1", ("GTX",), ("sm_61",))], 535)


def test_a_malformed_data_file_is_refused_naming_it(tmp_path):
    broken = tmp_path / "gpu_compat.yml"
    raw = yaml.safe_load(gpucompat.DATA_FILE.read_text())
    del raw["builds"][0]["min_driver_branch"]
    broken.write_text(yaml.safe_dump(raw))
    with pytest.raises(DtlabError, match=rf"{broken}: not a usable GPU compatibility file \(KeyError"):
        gpucompat.load(broken)
