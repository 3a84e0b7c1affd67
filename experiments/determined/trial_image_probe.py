"""Run by cluster.check and a Determined cell's preflight inside the trial image, on an agent, offline.

What Determined's task setup and startup-hook.sh need of the image's python3: its version (each pin's
Requires-Python), pip, and whether the hook's own `pip install` (the same constraints and requirements,
here with --dry-run --no-index) has anything left to fetch. Prints one JSON line; the decision is
dtlab.platforms.determined.config.trial_image_verdict's, on the controller. Standard library only,
Python 3.7 or newer: it runs in whatever image determined_trial_image names.

    python3 trial_image_probe.py [TORCH_REQUIREMENTS_FILE]
"""

import json
import os
import platform
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PIP_TIMEOUT_S = 120


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed():
    """{canonical name: version} of every distribution this python3 sees (None before Python 3.8)."""
    try:
        from importlib import metadata
    except ImportError:
        return None
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist.version)
    return found


def marker_environment():
    """PEP 508's environment markers, as pip evaluates them in this image."""
    implementation = sys.implementation
    info = implementation.version
    version = f"{info.major}.{info.minor}.{info.micro}"
    if info.releaselevel != "final":
        version += info.releaselevel[0] + str(info.serial)
    return {
        "implementation_name": implementation.name,
        "implementation_version": version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_python_implementation": platform.python_implementation(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def run(command):
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return 1, "", str(error)
    return done.returncode, done.stdout, done.stderr


def pip_version():
    code, out, _ = run([sys.executable, "-m", "pip", "--version"])
    words = out.split()
    return words[1] if code == 0 and len(words) > 1 else None


def pip_dry_run(torch_requirements):
    """startup-hook.sh's install, offline: exit 0 when every requirement is already satisfied."""
    command = [
        *(sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--disable-pip-version-check"),
        *("--quiet", "--constraint", os.path.join(HERE, "constraints.txt")),
        *("--requirement", os.path.join(HERE, "requirements.txt")),
    ]
    if torch_requirements and os.path.isfile(torch_requirements):
        command += ["--requirement", torch_requirements]
    code, _, err = run(command)
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    return {"exit": code, "errors": lines[-8:]}


def main():
    pip = pip_version()
    report = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "markers": marker_environment(),
        "installed": installed(),
        "pip": pip,
        "pip_dry_run": pip_dry_run(sys.argv[1] if len(sys.argv) > 1 else None) if pip else None,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
