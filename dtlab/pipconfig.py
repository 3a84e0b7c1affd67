"""pip's configuration as uv's, so that `uv pip install` looks where pip would.

scripts/setup.sh installs the controller's venv with uv: the same pins in about a third of pip's time on a
fresh machine (benchmarks/README.md, "uv for the venvs"). uv reads none of pip's configuration,
and a machine's pip.conf files and PIP_* variables may be where its packages are: a mirror, a proxy and its
certificate, a directory of wheels (the development and CI machines here keep torch's CPU wheel in one).
Input: `pip config list` (pip's view of its files and variables, `section.option='value'` a line). Output:
uv's options (`args`, one word a line) or the environment uv reads the rest from (`env`, NAME=value a line).
The controller's other venvs (Horovod's build venv) are installed the same way: `uv_install`.

Standard library only: setup.sh runs it with the system Python.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

# pip applies [global], then the command's own section, then its PIP_* variables (shown as ":env:").
SECTIONS = ("global", "install", ":env:")
# pip's options that take several values (whitespace-separated), and uv's option for each value.
REPEATED = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
SINGLE = {"index-url": "--index-url"}
FLAGS = {"no-index": "--no-index"}
# What uv takes from the environment alone: the certificate bundle, the proxy and the network timeout.
ENVIRONMENT = {"cert": ("SSL_CERT_FILE",), "proxy": ("HTTPS_PROXY", "HTTP_PROXY"),
               "timeout": ("UV_HTTP_TIMEOUT",), "default-timeout": ("UV_HTTP_TIMEOUT",)}
# pip takes the best version from every index and link together; uv by default stops at the first index
# that has the package, which on a machine whose local mirror holds an older release would pick that.
INDEX_STRATEGY = "UV_INDEX_STRATEGY=unsafe-best-match"
TRUE = {"1", "true", "yes", "on"}


class PipConfigError(ValueError):
    """A line of `pip config list` that is not `section.option='value'`."""


def effective(pip_config_list: str) -> dict[str, str]:
    """Each install option's value as pip would apply it: a later section's value replaces an earlier's."""
    found: dict[tuple[str, str], str] = {}
    for number, line in enumerate(pip_config_list.splitlines(), 1):
        if not line.strip():
            continue
        key, equals, quoted = line.partition("=")
        section, dot, option = key.rpartition(".")
        try:
            value = ast.literal_eval(quoted) if equals and dot else None
        except (ValueError, SyntaxError):
            value = None
        if not isinstance(value, str):
            raise PipConfigError(f"pip config list, line {number}: not section.option='value': {line!r}")
        found[(section, option.replace("_", "-"))] = value
    options: dict[str, str] = {}
    for section in SECTIONS:
        options.update({option: value for (where, option), value in found.items() if where == section})
    return options


def uv_args(options: dict[str, str]) -> list[str]:
    args: list[str] = []
    for option, flag in SINGLE.items():
        if options.get(option):
            args += [flag, options[option]]
    for option, flag in REPEATED.items():
        for value in options.get(option, "").split():
            args += [flag, value]
    for option, flag in FLAGS.items():
        if options.get(option, "").lower() in TRUE:
            args.append(flag)
    return args


def uv_environment(options: dict[str, str]) -> list[str]:
    assignments = [INDEX_STRATEGY]
    for option, names in ENVIRONMENT.items():
        if options.get(option):
            assignments += [f"{name}={options[option]}" for name in names]
    return list(dict.fromkeys(assignments))  # timeout and default-timeout are one


def uv_install(python: Path, *install_args: str) -> tuple[list[str], dict[str, str]]:
    """`uv pip install` into `python`'s venv, looking where this venv's pip would, and the environment
    variables it needs beside the caller's: the controller's uv, which setup.sh installed."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    options = effective(listed)
    uv = Path(sys.executable).with_name("uv")
    environment = dict(assignment.split("=", 1) for assignment in uv_environment(options))
    command = [str(uv), "pip", "install", "--quiet", "--python", str(python), *uv_args(options)]
    return [*command, *install_args], environment


if __name__ == "__main__":  # scripts/setup.sh: pip config list | python3 -m dtlab.pipconfig args|env
    if sys.argv[1:] not in (["args"], ["env"]):
        sys.exit("usage: pip config list | python3 -m dtlab.pipconfig args|env")
    try:
        pip_options = effective(sys.stdin.read())
    except PipConfigError as error:
        sys.exit(f"dtlab.pipconfig: {error}")
    for line in uv_args(pip_options) if sys.argv[1] == "args" else uv_environment(pip_options):
        print(line)  # nothing at all where pip has no configuration: setup.sh reads each line as a word
