#!/usr/bin/env bash
# Sets up a controller from nothing on Debian/Ubuntu, as root: system packages, then a
# virtualenv (.venv) with dtlab and every Python dependency pinned by constraints.txt (which it writes
# from the pins' parts: dtlab/pins.txt and each platform's dtlab/platforms/<name>/pins.txt, dtlab/pins.py).
# Idempotent: a second run only checks. Used by both README commands and by .ci/run.
#
#   scripts/setup.sh            install what the demo and the tests need
#   scripts/setup.sh --relock   also rewrite the pins' parts (and constraints.txt) from the installed venv
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "setup.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "must run as root (the local lab needs network namespaces and systemd-nspawn); try: sudo $0"
command -v apt-get >/dev/null || die "needs apt-get (Debian or Ubuntu)"

# System packages: the lab (mmdebstrap, nspawn, iproute2), SSH and rsync for the harness,
# Java 17 for Spark's driver on the controller, and a Python >= 3.11 with venv.
# cmake and g++: scripts/build-horovod-wheel.sh compiles Horovod for its tests and the lab (roles/horovod).
# openssh-server: only its sshd binary, for tests/provision/test_sshd_dropin.py (the ssh role's
# drop-in checked by a real sshd); where setup.sh installs it, the controller's own sshd stays off.
# nftables: only its nft binary, for tests/provision/test_firewall.py (the firewall role's rules loaded
# by a real nft in a network namespace of the test's own; the host's own ruleset is never touched).
APT_PACKAGES=(mmdebstrap systemd-container iproute2 openssh-client rsync ca-certificates cmake g++
              openjdk-17-jre-headless python3 python3-venv python3-dev gcc openssh-server nftables
              python3-debian dpkg-dev gnupg)
# python3-debian: deb822_repository in the GPU roles' check-mode tests; dpkg-dev: the offline bundle's
# repository index (dpkg-scanpackages) and the tests' stand-in packages; gnupg: their signed repositories.
install_system_packages() {
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  apt_updated=no
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup.sh: apt-get install ${missing[*]}"
    apt-get update -qq && apt_updated=yes
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [[ " ${missing[*]} " == *" openssh-server "* ]] && [ -d /run/systemd/system ]; then
      systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
    fi
  fi
  # Headless Chromium checks the HTML report in a real browser (tests/report/test_report_in_browser.py).
  # Debian ships it as a package, Ubuntu only as a snap: installed where apt has it, else that test skips.
  BROWSER=chromium-headless-shell
  if ! dpkg-query -W -f='${Status}' "$BROWSER" 2>/dev/null | grep -q "ok installed"; then
    [ "$apt_updated" = yes ] || apt-get update -qq
    if apt-cache show "$BROWSER" >/dev/null 2>&1; then
      echo "setup.sh: apt-get install $BROWSER"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$BROWSER" >/dev/null
    else
      echo "setup.sh: apt has no $BROWSER here: the report's browser test will be skipped"
    fi
  fi
}
# pip needs only Python's venv and headers from apt: where the machine has them, the other packages
# (mmdebstrap, Java, Chromium, ...) install beside pip's minutes instead of before them.
apt_log=$(mktemp)
apt_pid=""
venv_packages=$(dpkg-query -W -f='${Status}\n' python3-venv python3-dev 2>/dev/null | grep -c "ok installed" || true)
if [ "$venv_packages" = 2 ]; then
  install_system_packages >"$apt_log" 2>&1 &
  apt_pid=$!
else
  install_system_packages
fi

PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PYTHON is $("$PYTHON" -V 2>&1); dtlab needs Python >= 3.11 (set PYTHON=/path/to/python3.11)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# This venv's Python always writes its bytecode cache. The install below skips compiling (--no-compile) on
# the promise that Python compiles a module once, at its first import; where PYTHONDONTWRITEBYTECODE=1 is
# set (container images often set it; the development machines here do), every process compiled every
# module it imported again: 7 s of CPU for the trainer's imports alone, in each of the hundreds of Python
# processes the tests start (benchmarks/bytecode_cache.py). A .pth line runs at every start of this venv.
site_packages=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo 'import sys; sys.dont_write_bytecode = False' > "$site_packages/dtlab-write-bytecode.pth"

# One pin list for everything; the stamp skips pip when nothing changed since the last run. The platforms'
# Python clients are each platform class's python_client, read without importing dtlab (dtlab/pins.py).
clients_listed=$("$PYTHON" -m dtlab.pins clients) || die "cannot read the platforms' Python clients (above)"
"$PYTHON" -m dtlab.pins lock || die "cannot write constraints.txt from the pins' parts (above)"
clients=()
[ -z "$clients_listed" ] || mapfile -t clients <<< "$clients_listed"
stamp=.venv/.dtlab-installed
want=$( { cat constraints.txt pyproject.toml; printf '%s\n' "${clients[@]}"; } | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # uv installs the same pins as pip in a third of its time on a fresh machine (benchmarks/venv_install.py;
  # benchmarks/README.md, "uv for the venvs"), from where pip is configured to look (dtlab/pipconfig.py).
  # Like pip's --no-compile, it leaves the bytecode to each module's first import.
  .venv/bin/pip install -q -c constraints.txt uv
  uv_words=$(.venv/bin/python -m dtlab.pipconfig args) || die "cannot read pip's configuration for uv (above)"
  uv_vars=$(.venv/bin/python -m dtlab.pipconfig env) || die "cannot read pip's configuration for uv (above)"
  uv_args=()
  [ -z "$uv_words" ] || mapfile -t uv_args <<< "$uv_words"
  mapfile -t uv_env <<< "$uv_vars"
  # PYTHONWARNINGS: setuptools' editable build prints a 9-line banner on every install (a UserWarning that
  # folders named like the package may shadow it).
  env "${uv_env[@]}" PYTHONWARNINGS="ignore::UserWarning" .venv/bin/uv pip install -q --python .venv/bin/python \
    "${uv_args[@]}" -c constraints.txt --upgrade-package pip pip -e '.[test]' "${clients[@]}"
  echo "$want" > "$stamp"
fi

if [ -n "$apt_pid" ]; then
  wait "$apt_pid" || { cat "$apt_log" >&2; rm -f "$apt_log"; die "apt-get install failed (its output is above)"; }
  cat "$apt_log"
fi
rm -f "$apt_log"

if [ "${1:-}" = "--relock" ]; then
  .venv/bin/pip freeze --exclude-editable | sed -E 's/^(torch==[0-9.]+)\+[a-z0-9]+$/\1/' \
    | .venv/bin/python -m dtlab.pins relock
  .venv/bin/python -m dtlab.pins lock
  echo "setup.sh: the pins' parts and constraints.txt rewritten"
fi
echo "setup.sh: ready (.venv/bin/invoke --list)"
