"""One environment fingerprint: the trainer role's task and the harness's probe (trainer.deploy,
cluster.check, the recorded node_versions) run the same file and agree, here on the controller's .venv."""

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtlab import paths, probes, remote

VENV = paths.REPO_ROOT / ".venv"
ANSIBLE_PLAYBOOK = VENV / "bin" / "ansible-playbook"


def role_fingerprint(tmp_path: Path, venv: Path) -> dict:
    """The trainer role's own fingerprint task (tasks/fingerprint.yml) against `venv`, on this machine."""
    playbook = tmp_path / "fingerprint.yml"
    playbook.write_text(
        "- name: Fingerprint a venv as the trainer role does\n"
        "  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: The role's fingerprint tasks\n"
        "      ansible.builtin.include_role: {name: trainer, tasks_from: fingerprint.yml}\n"
    )
    env = {**os.environ, "ANSIBLE_CACHE_PLUGIN": "memory", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    answer = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", "-e", f"dtlab_venv_dir={venv}",
         "-e", f"dtlab_repo_dir={paths.REPO_ROOT}", str(playbook)],
        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert answer.returncode == 0, answer.stdout[-3000:] + answer.stderr[-2000:]
    tasks = json.loads(answer.stdout)["plays"][0]["tasks"]
    facts = tasks[-1]["hosts"]["localhost"]["ansible_facts"]
    return json.loads(facts["trainer_env_fingerprint"])


def harness_fingerprint(venv: Path, cwd: Path) -> dict:
    """dtlab.probes' command for one node, run here by a shell as SSH would, parsed as node_versions does."""
    answer = subprocess.run(["sh", "-c", probes.fingerprint_command(str(venv / "bin" / "python"))],
                            cwd=cwd, capture_output=True, text=True, timeout=120)
    result = remote.CommandResult("here", answer.returncode, answer.stdout, answer.stderr)
    return probes.parse_fingerprint(result)


@pytest.mark.slow
def test_the_role_and_the_harness_fingerprint_a_venv_alike(tmp_path):
    role = role_fingerprint(tmp_path, VENV)
    harness = harness_fingerprint(VENV, tmp_path)
    assert role == harness
    # It is this venv's environment (the tests run in it), with the recorded keys.
    assert harness["python"] == ".".join(map(str, sys.version_info[:3]))
    assert harness["torch"] == importlib.metadata.version("torch")
    assert len(harness["freeze_sha"]) == 16 and int(harness["freeze_sha"], 16) >= 0


@pytest.mark.slow
def test_the_fingerprint_is_the_venvs_not_the_callers(tmp_path):
    """Another venv answers differently; a package lying in the working directory counts for nothing."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    other = harness_fingerprint(bare, tmp_path)
    assert other["torch"] is None and other["freeze_sha"] != harness_fingerprint(VENV, tmp_path)["freeze_sha"]
    # A stray package's metadata in the directory the command starts in.
    stray = tmp_path / "cwd" / "stray-1.0.dist-info"
    stray.mkdir(parents=True)
    (stray / "METADATA").write_text("Metadata-Version: 2.1\nName: stray\nVersion: 1.0\n")
    assert harness_fingerprint(bare, stray.parent) == other
    assert role_fingerprint(tmp_path, bare) == other
