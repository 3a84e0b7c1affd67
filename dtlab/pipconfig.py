"""pip's configuration as uv's, so that `uv pip install` looks where pip would.

scripts/setup.sh installs the controller's venv with uv: the same pins in about a third of pip's time on a
fresh machine (benchmarks/README.md, "uv for the venvs"). uv reads none of pip's configuration,
and a machine's pip.conf files and PIP_* variables may be where its packages are: a mirror, a proxy and its
certificate, a directory of wheels (the development and CI machines here keep torch's CPU wheel in one).
Input: the options of `pip install` as pip's own parser sets them from its files and PIP_* variables, in a
venv's Python. (Not `pip config list`: pip 26 prints each file's values in the order of the files' names,
which is not the order pip applies them in.) Output: uv's options (`args`, one word a line) or the
environment uv reads the rest from (`env`, NAME=value a line).
The controller's other venvs (Horovod's build venv) are installed the same way: `uv_install`.

Standard library only: setup.sh runs it with the new venv's Python before anything else is installed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

# pip's option (its attribute name) for where packages come from, and uv's option for each of its values.
SINGLE = {"index_url": "--index-url"}
REPEATED = {
    "extra_index_urls": "--extra-index-url",
    "find_links": "--find-links",
    "constraints": "--constraint",
    "trusted_hosts": "--allow-insecure-host",
}
FLAGS = {"no_index": "--no-index"}
# What uv takes from the environment alone: the certificate bundle, the proxy and the network timeout.
ENVIRONMENT = {"cert": ("SSL_CERT_FILE",), "proxy": ("HTTPS_PROXY", "HTTP_PROXY"),
               "timeout": ("UV_HTTP_TIMEOUT",)}
# pip takes the best version from every index and link together; uv by default stops at the first index
# that has the package, which on a machine whose local mirror holds an older release would pick that.
INDEX_STRATEGY = "UV_INDEX_STRATEGY=unsafe-best-match"
# Run by the venv's Python: pip's parser for `pip install` applies its files and variables in its own
# precedence; what differs from pip's defaults is what the machine configured.
_READ_PIPS_OPTIONS = """
import json, sys
from pip._internal.commands import create_command
parser = create_command("install").parser
options, _ = parser.parse_args([])
print(json.dumps({name: getattr(options, name) for name in sys.argv[1:]
                  if getattr(options, name) != parser.defaults.get(name)}))
"""


class PipConfigError(ValueError):
    """pip cannot read its own configuration."""


def pips_install_options() -> dict[str, object]:
    """The options pip's configuration sets for `pip install` in this Python's venv, by pip's name."""
    names = [*SINGLE, *REPEATED, *FLAGS, *ENVIRONMENT]
    read = subprocess.run([sys.executable, "-c", _READ_PIPS_OPTIONS, *names], capture_output=True, text=True,
                          timeout=120)
    if read.returncode != 0:
        said = [line.strip() for line in (read.stderr + read.stdout).splitlines() if line.strip()]
        last = said[-1] if said else f"exit code {read.returncode}"
        raise PipConfigError(f"pip cannot read its configuration: {last}")
    return json.loads(read.stdout)


def uv_args(options: dict[str, object]) -> list[str]:
    args: list[str] = []
    for name, flag in SINGLE.items():
        if options.get(name):
            args += [flag, str(options[name])]
    for name, flag in REPEATED.items():
        for value in options.get(name) or []:
            args += [flag, value]
    for name, flag in FLAGS.items():
        if options.get(name):
            args.append(flag)
    return args


def uv_environment(options: dict[str, object]) -> list[str]:
    assignments = [INDEX_STRATEGY]
    for name, variables in ENVIRONMENT.items():
        value = options.get(name)
        if value:
            text = str(math.ceil(value)) if isinstance(value, float) else str(value)  # uv's timeout: seconds
            assignments += [f"{variable}={text}" for variable in variables]
    return assignments


def uv_install(python: Path, *install_args: str) -> tuple[list[str], dict[str, str]]:
    """`uv pip install` into `python`'s venv, looking where this venv's pip would, and the environment
    variables it needs beside the caller's: the controller's uv, which setup.sh installed."""
    options = pips_install_options()
    uv = Path(sys.executable).with_name("uv")
    environment = dict(assignment.split("=", 1) for assignment in uv_environment(options))
    command = [str(uv), "pip", "install", "--quiet", "--python", str(python), *uv_args(options)]
    return [*command, *install_args], environment


if __name__ == "__main__":  # scripts/setup.sh: .venv/bin/python -m dtlab.pipconfig args|env
    if sys.argv[1:] not in (["args"], ["env"]):
        sys.exit("usage: python -m dtlab.pipconfig args|env (in the venv whose pip's configuration to read)")
    try:
        pip_options = pips_install_options()
    except PipConfigError as error:
        sys.exit(f"dtlab.pipconfig: {error}")
    for line in uv_args(pip_options) if sys.argv[1] == "args" else uv_environment(pip_options):
        print(line)  # nothing at all where pip has no configuration: setup.sh reads each line as a word
