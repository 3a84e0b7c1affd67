"""Spark's GPU discovery script (roles/spark/templates/getGpusResources.sh.j2), rendered as the role renders
it and run against nvidia-smi's real answer: on the GPU machine of tests/fixtures/gpu-h200 it printed
spark-gpu-discovery.json; here a stand-in nvidia-smi (named so) replays that machine's captured answer."""

import json
import os
import subprocess
from pathlib import Path

import jinja2

from dtlab import paths

TEMPLATE = paths.REPO_ROOT / "roles" / "spark" / "templates" / "getGpusResources.sh.j2"
REAL = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-h200"


def discover(tmp_path: Path, gpu_indices: list[int], nvidia_smi_answer: str) -> dict:
    script = tmp_path / "getGpusResources.sh"
    script.write_text(jinja2.Environment(keep_trailing_newline=True).from_string(TEMPLATE.read_text()).render(
        ansible_managed="rendered by the test", gpu_indices=gpu_indices))
    stand_in = tmp_path / "bin" / "nvidia-smi"  # a stand-in: replays a real answer, records its argv
    stand_in.parent.mkdir()
    (tmp_path / "answer").write_text(nvidia_smi_answer)
    stand_in.write_text(f'#!/bin/sh\necho "$*" > {tmp_path}/argv\ncat {tmp_path}/answer\n')
    stand_in.chmod(0o755)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{stand_in.parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_real_machines_answer_gives_what_it_printed_there(tmp_path):
    real_answer = (REAL / "nvidia-smi-query-index.csv").read_text()
    assert discover(tmp_path, [], real_answer) == json.loads((REAL / "spark-gpu-discovery.json").read_text())
    assert (tmp_path / "argv").read_text().split() == ["--query-gpu=index", "--format=csv,noheader"]


def test_the_inventorys_gpu_indices_are_asked_for_and_every_address_is_listed(tmp_path):
    # nvidia-smi answers one index per line, as the real one did; two GPUs are two addresses.
    assert discover(tmp_path, [0, 1], "0\n1\n") == {"name": "gpu", "addresses": ["0", "1"]}
    assert (tmp_path / "argv").read_text().split()[-1] == "--id=0,1"
