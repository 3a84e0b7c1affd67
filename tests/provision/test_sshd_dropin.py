"""The ssh role's sshd drop-in with a real sshd on this machine: the role's own validate command accepts
it in context and refuses a broken one; `sshd -T` reports what the role requires; a live sshd on
loopback refuses passwords and still lets a key in as root (as the lab's harness logs in).

Needs /usr/sbin/sshd (openssh-server, installed by scripts/setup.sh) and root (sshd -t wants /run/sshd).
"""

import os
import re
import shlex
import socket
import subprocess
import time
from pathlib import Path

import jinja2
import pytest
import yaml

from dtlab import paths

ROLE = paths.REPO_ROOT / "roles" / "ssh"
SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")
SFTP_SERVER = "/usr/lib/openssh/sftp-server"

pytestmark = [
    pytest.mark.skipif(not SSHD.exists(), reason="no /usr/sbin/sshd: apt-get install openssh-server"),
    pytest.mark.skipif(os.geteuid() != 0, reason="sshd -t needs root (/run/sshd, host keys)"),
]


def role_defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults/main.yml").read_text())


def role_task(name_start: str) -> dict:
    tasks = yaml.safe_load((ROLE / "tasks/main.yml").read_text())
    return next(task for task in tasks if task["name"].startswith(name_start))


def render(text: str, **variables) -> str:
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True,
                                     keep_trailing_newline=True)
    return environment.from_string(text).render(**{**role_defaults(), **variables})


def dropin_text() -> str:
    return render((ROLE / "templates/sshd-dropin.conf.j2").read_text(), ansible_managed="test")


def required_lines() -> list[str]:
    """The lines the role's verification task requires in `sshd -T`'s output."""
    that = role_task("Require sshd to refuse password logins")["ansible.builtin.assert"]["that"]
    return [re.match(r"'([^']+)' in ssh_sshd_effective\.stdout_lines$", check).group(1) for check in that]


def validate(main_config: Path, candidate: Path) -> subprocess.CompletedProcess:
    """The template task's `validate`, run as Ansible runs it: %s is the new file, shlex-split, no shell."""
    command = role_task("Turn sshd's password logins off")["ansible.builtin.template"]["validate"]
    command = render(command, ssh_sshd_config_file=str(main_config)) % str(candidate)
    return subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module", autouse=True)
def privsep_dir():
    """sshd -t refuses to run without its privilege separation directory (sshd.service creates it)."""
    created = not PRIVSEP_DIR.exists()
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    yield
    if created:
        PRIVSEP_DIR.rmdir()


@pytest.fixture
def sshd_dir(tmp_path):
    """A main config like Debian's (Include of the drop-ins first, its sftp subsystem) with a site's
    `PasswordAuthentication yes`; a cloud-init drop-in that also says yes; our own host key and
    authorized_keys."""
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / key)], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "client_key.pub").read_text())
    dropins = tmp_path / "sshd_config.d"
    dropins.mkdir()
    (dropins / "50-cloud-init.conf").write_text("PasswordAuthentication yes\n")
    (tmp_path / "sshd_config").write_text(
        f"Include {dropins}/*.conf\n"
        f"HostKey {tmp_path}/host_key\n"
        f"AuthorizedKeysFile {tmp_path}/authorized_keys\n"
        "StrictModes no\nPidFile none\nUsePAM yes\nPasswordAuthentication yes\n"
        f"KbdInteractiveAuthentication yes\nSubsystem sftp {SFTP_SERVER}\n"
    )
    return tmp_path


def install_dropin(sshd_dir: Path) -> Path:
    target = sshd_dir / "sshd_config.d" / Path(role_defaults()["ssh_sshd_dropin_file"]).name
    target.write_text(dropin_text())
    return target


def effective(main_config: Path) -> list[str]:
    result = subprocess.run([str(SSHD), "-T", "-f", str(main_config)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


# --- the validate command ------------------------------------------------------------------------------

def test_validate_accepts_the_dropin_with_the_main_config_and_cleans_up(sshd_dir):
    candidate = sshd_dir / "ansible-tmp-source"
    candidate.write_text(dropin_text())
    result = validate(sshd_dir / "sshd_config", candidate)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in sshd_dir.iterdir() if p.name.startswith("ansible-tmp")) == [candidate.name]


def test_validate_refuses_a_broken_dropin(sshd_dir):
    candidate = sshd_dir / "ansible-tmp-source"
    candidate.write_text(dropin_text() + "PasswordAuthentication maybe\n")
    result = validate(sshd_dir / "sshd_config", candidate)
    assert result.returncode != 0
    assert f"{candidate} line" in result.stderr and "unsupported option" in result.stderr, result.stderr


def test_validate_refuses_a_dropin_that_clashes_with_the_main_config(sshd_dir):
    """In context: valid alone, but the main config defines the same sftp subsystem again."""
    candidate = sshd_dir / "ansible-tmp-source"
    candidate.write_text(dropin_text() + f"Subsystem sftp {SFTP_SERVER}\n")
    alone = subprocess.run([str(SSHD), "-t", "-f", str(candidate)], capture_output=True, text=True,
                           timeout=60)
    result = validate(sshd_dir / "sshd_config", candidate)
    assert alone.returncode == 0, alone.stderr  # what `validate: sshd -t -f %s` would have let through
    assert result.returncode != 0
    assert "Subsystem 'sftp' already defined" in result.stderr, result.stderr


# --- the effective settings ------------------------------------------------------------------------------

def test_sshd_T_reports_what_the_role_requires_despite_later_yes(sshd_dir):
    lines = effective(sshd_dir / "sshd_config")
    assert not set(required_lines()) <= set(lines)  # without the drop-in, the site's yes wins
    install_dropin(sshd_dir)
    lines = effective(sshd_dir / "sshd_config")
    assert set(required_lines()) <= set(lines), [line for line in lines if "auth" in line]
    assert required_lines() == ["passwordauthentication no", "kbdinteractiveauthentication no"]
    assert "permitrootlogin without-password" in lines  # prohibit-password, as sshd -T names it


# --- a live sshd -------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ssh(sshd_dir: Path, port: int, *options: str) -> subprocess.CompletedProcess:
    argv = ["ssh", "-p", str(port), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            "-o", f"UserKnownHostsFile={sshd_dir}/known_hosts", "-o", "StrictHostKeyChecking=no",
            "-o", "LogLevel=ERROR", *options, "root@127.0.0.1", "echo", "logged-in"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def login_attempts(sshd_dir: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """(a password-only attempt, a key attempt) against a live sshd with this main config, on loopback."""
    port = free_port()
    daemon = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(sshd_dir / "sshd_config"), "-p", str(port),
                               "-o", "ListenAddress=127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=open(sshd_dir / "sshd.log", "ab"))  # noqa: SIM115
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert daemon.poll() is None, (sshd_dir / "sshd.log").read_text()
            assert time.monotonic() < deadline, "sshd did not listen within 20 s"
            time.sleep(0.1)
        password = ssh(sshd_dir, port, "-o", "PreferredAuthentications=password,keyboard-interactive",
                       "-o", "PubkeyAuthentication=no")
        key = ssh(sshd_dir, port, "-o", "IdentitiesOnly=yes", "-i", str(sshd_dir / "client_key"))
        return password, key
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


def test_live_sshd_refuses_passwords_and_admits_the_key(sshd_dir):
    password, key = login_attempts(sshd_dir)
    # Without the drop-in this sshd offers passwords: the check below can tell the difference.
    assert "Permission denied (publickey,password,keyboard-interactive)" in password.stderr, password.stderr
    install_dropin(sshd_dir)
    password, key = login_attempts(sshd_dir)
    assert password.returncode == 255
    assert "Permission denied (publickey)." in password.stderr, password.stderr
    assert key.returncode == 0 and key.stdout.strip() == "logged-in", key.stderr
