#!/usr/bin/env bash
# Builds a Horovod wheel (PyTorch + Gloo, no MPI; with --gpu-operations NCCL also Horovod's GPU operations
# over NCCL) against the torch of a given Python, from PyPI's horovod sdist with dtlab's own one-line build
# fix: the C++ standard raised from 14 to 17. Built with upstream's -O3, without debug info (see "the build").
#
# GPU nodes need the NCCL build: the trainer moves the model to CUDA before hvd.broadcast_parameters, and a
# build without GPU operations fails there ("Requested ReadyEvent with GPU device but not compiled with
# CUDA"). It compiles Horovod's CUDA kernels with the CUDA toolkit's nvcc (CUDA_HOME, default /usr/local/cuda,
# else nvcc on PATH), of the same major version as torch's CUDA build, for the compute capabilities given;
# NCCL is the one torch's CUDA build brings (PYTHON's nvidia-nccl-cu* wheel), linked as a shared library.
#
# Why: PyPI's last release, horovod 0.28.1 (2023-06-12), compiles with C++14, and torch >= 2.1 needs
# C++17 ("#error C++17 or later compatible compiler is required to use PyTorch", horovod issues #3996
# and #4014). Its CMakeLists strip any -std= from CXXFLAGS, so only an edit of the sources helps.
# Upstream fixed it in PR #3998, merged but never released. dtlab keeps no copy of that patch: it
# raises both `set(CMAKE_CXX_STANDARD 14)` lines (the project's, which also builds Gloo, and the torch
# extension's) to 17, so Horovod, its Gloo and the extension are all C++17 (raising the extension's
# alone fails at link time: multiple definition of gloo::rendezvous::Store::kDefaultTimeout).
#
# A Horovod wheel is bound to the exact torch it was compiled against, so the wheel's version carries
# that torch as a local label: horovod-0.28.1+torch2.13.0.cpu-cp311-cp311-linux_x86_64.whl, and a GPU
# build ".nccl" after it: horovod-0.28.1+torch2.13.0.cu126.nccl-... (`pip install horovod==0.28.1` still
# matches either). When OUT_DIR already holds the wheel for this
# Horovod, torch and Python, nothing is built; a second caller for the same OUT_DIR waits for the first.
# The machine keeps a copy of each wheel outside any checkout ($DTLAB_HOROVOD_CACHE, default
# ~/.cache/dtlab/horovod-wheels/<this script's hash>-<the sdist pin's>), so another clone, or a wiped .dtlab,
# copies it instead of compiling for minutes; a changed script or pin is a new key, and a key unused for
# 30 days is deleted when a wheel is kept. DTLAB_HOROVOD_CACHE= (empty) turns it off.
#
#   scripts/build-horovod-wheel.sh --python VENV/bin/python --out OUT_DIR
#       [--version V --sha256 H]   the sdist pin (default: horovod_version and horovod_sdist_sha256
#                                  from this checkout's inventory/group_vars/all.yml)
#       [--sdist PATH]             use this sdist instead of downloading it with pip (checked the same)
#       [--jobs N] [--timeout S]   parallel compile jobs (default 2) and the build's time limit (3600)
#       [--gpu-operations none|NCCL --cuda-cc-list 60,61,...]
#                                  Horovod's GPU operations (default none: CPU tensors over Gloo) and,
#                                  for NCCL, the compute capabilities its CUDA kernels are built for
#
# PYTHON must have torch and Horovod's setup_requires installed (cloudpickle, psutil, pyyaml,
# packaging, cffi; setuptools >= 70.1 or wheel): the build runs without isolation, against that torch.
# Needs cmake >= 3.13, a C++17 compiler (c++) and Python's headers (python3-dev).
# The caller's HOROVOD_GPU* / HOROVOD_NCCL* / HOROVOD_CUDA* variables are ignored: --gpu-operations decides.
# Prints the wheel's path as its last line; exit != 0 with one line on error.
set -euo pipefail

die() { echo "build-horovod-wheel: $*" >&2; exit 2; }

repo_dir="$(cd "$(dirname "$0")/.." && pwd)"
python="" out_dir="" version="" sha256="" sdist="" jobs=2 timeout_s=3600 gpu_operations=none cuda_cc_list=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python|--out|--version|--sha256|--sdist|--jobs|--timeout|--gpu-operations|--cuda-cc-list)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --python) python="$2" ;; --out) out_dir="$2" ;; --version) version="$2" ;;
        --sha256) sha256="$2" ;; --sdist) sdist="$2" ;; --jobs) jobs="$2" ;; --timeout) timeout_s="$2" ;;
        --gpu-operations) gpu_operations="$2" ;; --cuda-cc-list) cuda_cc_list="$2" ;;
      esac
      shift 2 ;;
    -h|--help) sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d'; exit 0 ;;  # the header above
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$python" ] || die "--python is required (a venv's python with torch installed)"
[ -n "$out_dir" ] || die "--out is required (the directory the wheel goes to)"
[ -x "$python" ] || die "--python $python is not an executable"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs $jobs is not a positive whole number"
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || die "--timeout $timeout_s is not a positive whole number of seconds"
case "$gpu_operations" in
  none) [ -z "$cuda_cc_list" ] || die "--cuda-cc-list is for --gpu-operations NCCL only" ;;
  NCCL) [[ "$cuda_cc_list" =~ ^[1-9][0-9]+(,[1-9][0-9]+)*$ ]] \
          || die "--gpu-operations NCCL needs --cuda-cc-list, compute capabilities like 60,61,90 (got '$cuda_cc_list')" ;;
  *) die "--gpu-operations $gpu_operations: give none or NCCL" ;;
esac

# The pin's one home is group_vars/all.yml; the role passes it explicitly (no checkout on a node).
if [ -z "$version" ] || [ -z "$sha256" ]; then
  group_vars="$repo_dir/inventory/group_vars/all.yml"
  [ -f "$group_vars" ] || die "--version and --sha256 are required outside a dtlab checkout"
  pins=$("$python" -c 'import sys, yaml
v = yaml.safe_load(open(sys.argv[1]))
print(v.get("horovod_version", ""), v.get("horovod_sdist_sha256", ""))' "$group_vars" 2>/dev/null) \
    || die "cannot read horovod_version and horovod_sdist_sha256 from $group_vars with $python (pyyaml?)"
  read -r pinned_version pinned_sha256 <<<"$pins"
  version="${version:-$pinned_version}" sha256="${sha256:-$pinned_sha256}"
  [ -n "$version" ] && [ -n "$sha256" ] || die "$group_vars lacks horovod_version or horovod_sdist_sha256"
fi
[[ "$version" =~ ^[0-9]+(\.[0-9]+)+$ ]] || die "horovod version '$version' is not a release number like 0.28.1"
[[ "$sha256" =~ ^[0-9a-f]{64}$ ]] || die "sdist sha256 '$sha256' is not 64 lowercase hex digits"

# The torch this wheel is bound to, and the Python tag it is built for. The version from torch's metadata
# (the same string as torch.__version__): importing torch only to ask took 5 s of every converge.
build_target=$("$python" -c 'import sys, importlib.metadata as m
print(m.version("torch"), "cp%d%d" % sys.version_info[:2])' 2>/dev/null) \
  || die "$python has no torch: give the python of a venv with the pinned torch installed"
read -r torch_version python_tag <<<"$build_target"
[ -n "$python_tag" ] || die "$python has no torch: give the python of a venv with the pinned torch installed"
torch_label="torch$(printf '%s' "$torch_version" | tr -c 'A-Za-z0-9.\n' '.')"  # 2.13.0+cpu -> torch2.13.0.cpu
# The CUDA major version of torch's build: dtlab installs CUDA builds by their label (torch==2.13.0+cu126,
# roles/trainer/vars/main.yml); PyPI's own CUDA build has none, and torch itself is asked (an import, 5 s).
torch_cuda_major=""
if [ "$gpu_operations" = NCCL ]; then
  case "$torch_version" in
    *+cu*) torch_cuda="${torch_version##*+cu}"; torch_cuda_major="${torch_cuda:0:-1}" ;;  # cu126 -> 12
    *+*) ;;
    *) torch_cuda_major=$("$python" -c 'import torch; print((torch.version.cuda or "").split(".")[0])' 2>/dev/null) ;;
  esac
  [ -n "$torch_cuda_major" ] \
    || die "--gpu-operations NCCL needs a CUDA build of torch in $python, which has torch $torch_version"
fi
# A CPU wheel never stands in for a GPU one, nor a GPU one built for other GPUs: 60,61 -> .nccl.cc60.61
[ "$gpu_operations" = none ] || torch_label="$torch_label.nccl.cc${cuda_cc_list//,/.}"
wheel_version="$version+$torch_label"

mkdir -p "$out_dir" || die "cannot create the output directory $out_dir"
out_dir="$(cd "$out_dir" && pwd)"
cache_root="${DTLAB_HOROVOD_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/dtlab/horovod-wheels}"
cache_dir=""
# Keyed by this script and the pinned sdist: a wheel built another way, or from another sdist, never matches.
[ -z "$cache_root" ] || cache_dir="$cache_root/$(sha256sum "$0" | cut -c1-16)-${sha256:0:16}"

place() {  # SRC DEST: all of SRC at DEST or nothing (a partial copy beside DEST, named by PID, then renamed)
  local partial
  partial="$(dirname "$2")/.$(basename "$2").$$.partial"
  cp "$1" "$partial" && mv "$partial" "$2"
}
keep_in_cache() {  # best effort: a cache that cannot be written costs the next clone a build, nothing more
  local name
  name="$(basename "$1")"
  [ -n "$cache_dir" ] && [ ! -f "$cache_dir/$name" ] || return 0
  { mkdir -p "$cache_dir" && place "$1" "$cache_dir/$name"; } 2>/dev/null \
    || { echo "build-horovod-wheel: could not keep a copy in $cache_dir (a later clone builds again)" >&2; return 0; }
  # Keys of an older script or pin are never read by this checkout again; ones unused for a month go.
  find "$cache_root" -mindepth 1 -maxdepth 1 -type d -mtime +30 -exec rm -rf {} + 2>/dev/null || true
}
# One build per output directory at a time: a second caller (parallel test workers, the converge beside
# a test) waits for the first and then finds its wheel, instead of compiling the same minutes again.
# The horovod role waits on the same lock before it looks for a wheel (roles/horovod, horovod_build_lock).
exec 9>"$out_dir/.horovod-build.lock" || die "cannot open the lock $out_dir/.horovod-build.lock"
flock --timeout "$timeout_s" 9 || die "another build held $out_dir/.horovod-build.lock for ${timeout_s}s"
shopt -s nullglob
present=("$out_dir/horovod-$wheel_version-$python_tag-$python_tag-"*.whl)
shopt -u nullglob
if [ ${#present[@]} -gt 0 ]; then
  echo "build-horovod-wheel: present, not rebuilt (horovod $version, torch $torch_version, $python_tag)" >&2
  keep_in_cache "${present[0]}"
  echo "${present[0]}"
  exit 0
fi
given_sha256=""
[ -z "$sdist" ] || [ ! -f "$sdist" ] || given_sha256=$(sha256sum "$sdist" | cut -d' ' -f1)
cached=()
# A given --sdist must be the pinned one before a wheel built from the pin stands in for it; else the
# checksum check below refuses it.
if [ -n "$cache_dir" ] && { [ -z "$sdist" ] || [ "$given_sha256" = "$sha256" ]; }; then
  shopt -s nullglob
  cached=("$cache_dir/horovod-$wheel_version-$python_tag-$python_tag-"*.whl)
  shopt -u nullglob
fi
if [ ${#cached[@]} -gt 0 ]; then
  wheel="$out_dir/$(basename "${cached[0]}")"
  place "${cached[0]}" "$wheel" || die "cannot copy ${cached[0]} into $out_dir"
  touch "$cache_dir" 2>/dev/null || true  # in use: not a month-old key
  echo "build-horovod-wheel: copied from this machine's cache $cache_dir, not rebuilt (horovod $version, torch $torch_version, $python_tag)" >&2
  echo "$wheel"
  exit 0
fi

# --- what the build needs, checked before minutes are spent ------------------------------------
command -v cmake >/dev/null || die "cmake not found (apt-get install cmake)"
command -v c++ >/dev/null || die "no C++ compiler (c++) found (apt-get install g++)"
missing=$("$python" - <<'EOF'
import importlib.util, os, sysconfig
need = {"cloudpickle": "cloudpickle", "psutil": "psutil", "yaml": "pyyaml", "packaging": "packaging",
        "cffi": "cffi", "setuptools": "setuptools"}
missing = [pkg for module, pkg in need.items() if importlib.util.find_spec(module) is None]
if "setuptools" not in missing and importlib.util.find_spec("wheel") is None:
    import setuptools
    if tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (70, 1):
        missing.append("wheel")  # setuptools carries bdist_wheel itself only from 70.1
if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    missing.append("Python.h (apt-get install python3-dev)")
print(" ".join(missing))
EOF
) || die "$python cannot check its build requirements"
[ -z "$missing" ] || die "$python lacks what the build needs: $missing (pip install them; the build runs without isolation)"
gpu_env=()
if [ "$gpu_operations" = NCCL ]; then
  cuda_home="${CUDA_HOME:-/usr/local/cuda}"
  if [ ! -x "$cuda_home/bin/nvcc" ] && nvcc_path=$(command -v nvcc); then
    cuda_home="$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")"
  fi
  [ -x "$cuda_home/bin/nvcc" ] || die "--gpu-operations NCCL compiles CUDA kernels and finds no nvcc (CUDA_HOME, /usr/local/cuda, PATH): install CUDA toolkit $torch_cuda_major.x where the wheel is built (on a GPU node: nvidia_cuda_toolkit_install: true)"
  nvcc_major=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  [ "$nvcc_major" = "$torch_cuda_major" ] \
    || die "$cuda_home/bin/nvcc is CUDA ${nvcc_major:-of an unknown release}, torch $torch_version is CUDA $torch_cuda_major: give CUDA_HOME a CUDA $torch_cuda_major.x toolkit"
  nccl_dir=$("$python" -c 'import importlib.util as u
spec = u.find_spec("nvidia.nccl")
print(list(spec.submodule_search_locations)[0] if spec else "")' 2>/dev/null) || nccl_dir=""
  [ -f "$nccl_dir/include/nccl.h" ] && [ -f "$nccl_dir/lib/libnccl.so.2" ] \
    || die "$python has no NCCL wheel with headers (nvidia-nccl-cu$torch_cuda_major, which torch's CUDA build installs): reinstall torch $torch_version"
  # CUDA_HOME too: torch's cpp_extension, which Horovod's CMake asks for the extension's CUDA libraries, would
  # otherwise guess it from nvcc's place on PATH (seen: /usr/local, from a /usr/local/bin/nvcc wrapper).
  gpu_env=(CUDA_HOME="$cuda_home" HOROVOD_GPU=CUDA HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$cuda_home"
           HOROVOD_NCCL_LINK=SHARED
           HOROVOD_NCCL_INCLUDE="$nccl_dir/include" HOROVOD_BUILD_CUDA_CC_LIST="$cuda_cc_list")
fi

work_dir="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
log="$work_dir/build.log"
keep_work_dir=yes  # kept, with its log, when a step that logs fails
trap 'if [ "$keep_work_dir" = no ] || [ ! -s "$log" ]; then rm -rf "$work_dir"; fi' EXIT

# --- the sdist: PyPI's, checked against the pin ------------------------------------------------
if [ -z "$sdist" ]; then
  echo "build-horovod-wheel: downloading the horovod $version sdist" >&2
  "$python" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
      --dest "$work_dir" "horovod==$version" >"$log" 2>&1 \
    || die "pip could not download the horovod $version sdist (log: $log)"
  sdist="$work_dir/horovod-$version.tar.gz"
fi
[ -f "$sdist" ] || die "sdist $sdist not found"
actual_sha256=${given_sha256:-$(sha256sum "$sdist" | cut -d' ' -f1)}
[ "$actual_sha256" = "$sha256" ] \
  || die "$sdist has sha256 $actual_sha256, not the pinned $sha256 (horovod_sdist_sha256)"
tar -xzf "$sdist" -C "$work_dir" || die "cannot unpack $sdist"
src="$work_dir/horovod-$version"
[ -d "$src" ] || die "$sdist does not unpack to horovod-$version/"

# --- dtlab's edits: C++17 everywhere, and the torch label in the version ---------------------------
for cmake_file in CMakeLists.txt horovod/torch/CMakeLists.txt; do
  [ "$(grep -c 'set(CMAKE_CXX_STANDARD 14)' "$src/$cmake_file")" = 1 ] \
    || die "$cmake_file of horovod $version has no single 'set(CMAKE_CXX_STANDARD 14)' line: the C++17 edit does not fit this release"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/$cmake_file"
done
grep -q "^__version__ = '$version'\$" "$src/horovod/__init__.py" \
  || die "horovod/__init__.py of horovod $version does not say __version__ = '$version'"
sed -i "s/^__version__ = '$version'\$/__version__ = '$wheel_version'/" "$src/horovod/__init__.py"

# --- the build ---------------------------------------------------------------------------------------
echo "build-horovod-wheel: building horovod $wheel_version for $python_tag (-j$jobs, up to ${timeout_s}s; log: $log)" >&2
started=$SECONDS
unset HOROVOD_WITHOUT_GLOO HOROVOD_WITH_MPI HOROVOD_GPU HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE \
  HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLGATHER HOROVOD_CUDA_HOME HOROVOD_CUDA_INCLUDE HOROVOD_CUDA_LIB \
  HOROVOD_NCCL_HOME HOROVOD_NCCL_INCLUDE HOROVOD_NCCL_LIB HOROVOD_NCCL_LINK HOROVOD_BUILD_CUDA_CC_LIST
if [ "$gpu_operations" = NCCL ]; then
  # The wheel's NCCL is libnccl.so.2 alone; CMake's find_library looks for libnccl.so.
  mkdir -p "$work_dir/nccl-lib" && ln -s "$nccl_dir/lib/libnccl.so.2" "$work_dir/nccl-lib/libnccl.so" \
    || die "cannot link $nccl_dir/lib/libnccl.so.2 into $work_dir/nccl-lib"
  gpu_env+=(HOROVOD_NCCL_LIB="$work_dir/nccl-lib")
fi
# setup.py configures CMake as RelWithDebInfo (-O3 -g). The debug info made 60 of the torch extension's
# 62 MB (2 MB without it) and costs compile time on every fresh controller. HOROVOD_CMAKE, setup.py's own hook for the cmake binary,
# names a wrapper that configures with the same -O3 and no -g; `cmake --build` passes through as it is.
real_cmake=$(command -v cmake) || die "needs cmake >= 3.13 on PATH"
cat >"$work_dir/cmake" <<EOF
#!/bin/sh
[ "\$1" = --build ] && exec "$real_cmake" "\$@"
exec "$real_cmake" "\$@" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O3 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O3 -DNDEBUG"
EOF
chmod +x "$work_dir/cmake"
build_status=0
env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$jobs" HOROVOD_CMAKE="$work_dir/cmake" "${gpu_env[@]}" \
  timeout "$timeout_s" "$python" -m pip wheel --no-build-isolation --no-deps --verbose \
    --wheel-dir "$work_dir/dist" "$src" >>"$log" 2>&1 || build_status=$?
if [ "$build_status" != 0 ]; then
  tail -n 25 "$log" >&2
  [ "$build_status" = 124 ] && die "the build ran past ${timeout_s}s and was stopped (log: $log)"
  die "the build failed with exit $build_status after $((SECONDS - started))s (log: $log)"
fi
built=("$work_dir/dist/horovod-$wheel_version-"*.whl)
[ -f "${built[0]}" ] || die "pip reported success but left no horovod wheel in $work_dir/dist (log: $log)"
wheel="$out_dir/$(basename "${built[0]}")"
place "${built[0]}" "$wheel" || die "cannot copy the built wheel into $out_dir"  # never a half-written one
keep_work_dir=no
echo "build-horovod-wheel: built in $((SECONDS - started))s" >&2
keep_in_cache "$wheel"
echo "$wheel"
