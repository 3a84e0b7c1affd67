"""scripts/setup.sh's venv: it writes its bytecode, and uv installs it from where pip is configured to look
(dtlab/pipconfig.py)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from dtlab import pipconfig

UV = Path(sys.executable).with_name("uv")


def test_setup_shs_venv_writes_bytecode_where_the_environment_says_not_to(tmp_path):
    # setup.sh installs without compiling: a module is to be compiled once, at its first import, which needs
    # its bytecode written even under PYTHONDONTWRITEBYTECODE=1 (benchmarks/bytecode_cache.py).
    (tmp_path / "first_import.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    subprocess.run([sys.executable, "-c", "import first_import"], env=env, check=True, timeout=60)
    assert [path.name for path in (tmp_path / "__pycache__").glob("first_import.*.pyc")], (
        "the venv's Python wrote no bytecode: run scripts/setup.sh")


def test_pip_applies_its_sections_in_order_and_uv_gets_the_result(tmp_path, monkeypatch):
    # The machine's own files are read too (pip always reads /etc/pip.conf): what the expected result takes
    # from this file is in its [install] section, which overrides theirs, but for find-links, whose [global]
    # value this file's [install] replaces.
    (tmp_path / "pip.conf").write_text("\n".join([
        "[global]", "find-links = /global/wheels",
        "[install]", "find-links = /install/wheels /more/wheels", "index-url = https://mirror.example/simple",
        "no-index = true", "cert = /etc/ssl/proxy.pem",
        "[download]", "find-links = /not/for/install", ""]))
    for name in [name for name in os.environ if name.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "none"))
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/simple")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "179.5")
    options = pipconfig.pips_install_options()
    assert pipconfig.uv_args(options) == [
        "--index-url", "https://env.example/simple",
        "--find-links", "/install/wheels", "--find-links", "/more/wheels", "--no-index"]
    assert pipconfig.uv_environment(options) == [
        "UV_INDEX_STRATEGY=unsafe-best-match", "SSL_CERT_FILE=/etc/ssl/proxy.pem", "UV_HTTP_TIMEOUT=180"]


def _wheel(directory: Path, version: str) -> None:
    """A pure-Python wheel of the package `tiny`, as a build backend writes it."""
    info = f"tiny-{version}.dist-info"
    files = {
        "tiny/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: tiny\nVersion: {version}\n",
        f"{info}/WHEEL": ("Wheel-Version: 1.0\nGenerator: dtlab-test\nRoot-Is-Purelib: true\n"
                          "Tag: py3-none-any\n"),
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(directory / f"tiny-{version}-py3-none-any.whl", "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)


def test_uv_installs_what_pip_would_from_pips_own_configuration(tmp_path, monkeypatch):
    # Two folders of wheels and constraints, known to pip only through its config files and a PIP_*
    # variable; no index. pip picks the best version across both folders under the constraint of its
    # highest-precedence file; uv_install (setup.sh's way, and Horovod's build venv's) must pick the same,
    # offline. The overriding file's name sorts before the overridden one's: `pip config list` prints its
    # files in name order, not precedence order (on CI, a checkout under /check sorted before /etc/xdg).
    _wheel(tmp_path / "old", "1.0")
    _wheel(tmp_path / "new", "2.0")
    _wheel(tmp_path / "new", "3.0")
    (tmp_path / "cap.txt").write_text("tiny<3\n")
    (tmp_path / "other.txt").write_text("something-else<1\n")
    (tmp_path / "aa.conf").write_text(f"[global]\nno-index = true\nfind-links = {tmp_path / 'old'}\n"
                                      f"constraint = {tmp_path / 'cap.txt'}\n")
    (tmp_path / "zz-global/pip").mkdir(parents=True)
    (tmp_path / "zz-global/pip/pip.conf").write_text(f"[global]\nconstraint = {tmp_path / 'other.txt'}\n")
    for name in [name for name in os.environ if name.startswith(("PIP_", "UV_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "zz-global"))  # pip's global files: here and /etc
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "aa.conf"))  # overrides the global files
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path / 'old'} {tmp_path / 'new'}")  # replaces the file's
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    report = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                             "tiny"], capture_output=True, text=True, check=True, timeout=120)
    pips_choice = json.loads(report.stdout)["install"][0]["metadata"]["version"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    command, uv_environment = pipconfig.uv_install(venv / "bin/python", "tiny")
    assert command[0] == str(UV)
    subprocess.run(command, env=os.environ | uv_environment | {"UV_OFFLINE": "1"}, check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin/python"), "-c", "import tiny; print(tiny.VERSION)"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert pips_choice == "2.0"
    assert installed == pips_choice


def test_setup_shs_reader_prints_no_word_where_pip_has_no_configuration_and_one_line_for_a_bad_one(
        tmp_path, monkeypatch):
    # setup.sh reads each output line as one of uv's words: an empty line would be an empty argument.
    for name in [name for name in os.environ if name.startswith("PIP_")]:
        monkeypatch.delenv(name)

    def read(what: str, config: Path | str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dtlab.pipconfig", what], text=True, capture_output=True,
                              timeout=60, cwd=Path(pipconfig.__file__).parents[1],
                              env=os.environ | {"PIP_CONFIG_FILE": str(config)})

    assert read("args", os.devnull).stdout == ""  # pip reads no file at all
    assert read("env", os.devnull).stdout == "UV_INDEX_STRATEGY=unsafe-best-match\n"
    (tmp_path / "pip.conf").write_text("[global]\ntimeout = soon\n")
    refused = read("args", tmp_path / "pip.conf")
    assert refused.returncode != 0 and refused.stdout == ""
    assert refused.stderr.strip().startswith("dtlab.pipconfig: pip cannot read its configuration:")
    assert "soon" in refused.stderr and "\n" not in refused.stderr.strip()
