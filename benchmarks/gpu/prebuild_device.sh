#!/usr/bin/env bash
# Builds the extension on this machine for the GPU machine (Python 3.12, torch 2.11.0+cu130, sm_90a), so a
# device lease, which is minutes long, does not spend 90-120 s of it compiling. No GPU is needed here.
#
#   bash benchmarks/gpu/prebuild_device.sh        # ~10 min on 2 cores the first time; then incremental
#
# Result: .prebuilt/_C.cpython-312-x86_64-linux-gnu.so (debug info stripped) and .prebuilt/stamp, the hash
# of the build inputs (benchmarks/gpu/build_stamp.py). Carry it to the GPU machine with the working tree
# (device run: carry [".prebuilt"]); benchmarks/gpu/gpu_check.sh there uses it when the stamp matches the tree
# it was sent with and the library imports, and builds from source otherwise. Rebuild after every change to
# csrc/, setup.py or build_config.json (the stamp would no longer match).
#
# The build runs in a copy of the working tree (tracked and untracked, not ignored files: what a device run
# sends), in a venv of Python $PREBUILD_PYTHON with torch $PREBUILD_TORCH and no dependencies; torch's CUDA
# libraries (needed to import it) are linked from the Python that runs `make test` here.
# Environment: PREBUILD_WORK=/tmp/attn_ops_prebuild, PREBUILD_PYTHON=python3.12, PREBUILD_TORCH=2.11.0,
# PREBUILD_ARCH=9.0a (the GPU machine's TORCH_CUDA_ARCH_LIST), MAX_JOBS=2.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${PREBUILD_WORK:-/tmp/attn_ops_prebuild}
python=${PREBUILD_PYTHON:-python3.12}
torch_version=${PREBUILD_TORCH:-2.11.0}
arch=${PREBUILD_ARCH:-9.0a}
venv=$work/venv
mkdir -p "$work"

if ! [ -x "$venv/bin/python" ]; then
  # pyenv's shim answers for a version that is installed but not selected only through its own path
  "$python" -c "" 2>/dev/null || python=$(ls "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 | tail -n 1)
  "$python" -m venv "$venv"
fi
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if ! [ -e "$site/nvidia" ]; then
  nvidia=$(python3 -c "import nvidia, os; print(list(nvidia.__path__)[0])")
  ln -s "$nvidia" "$site/nvidia"
fi
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  "$venv/bin/pip" install -q --no-deps "torch==$torch_version"
  "$venv/bin/pip" install -q typing_extensions sympy networkx jinja2 filelock fsspec "setuptools<82" wheel ninja
fi

# The tree a device run sends; tar keeps the modification times, so ninja recompiles only what changed.
mkdir -p "$work/src"
rm -rf "$work/src/csrc"
(cd "$repo" && git ls-files -z -c -o --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$work/src"

cd "$work/src"
# The cuDNN backend's headers: the same carried copy the device run sends (make cudnn-frontend-carry), so the
# library and the GPU machine's stamp agree on them (build_stamp.py).
if [[ -z "${ATTN_OPS_CUDNN_FRONTEND_INCLUDE:-}" && -e "$repo/.cudnn_frontend/include/cudnn_frontend.h" ]]; then
  export ATTN_OPS_CUDNN_FRONTEND_INCLUDE="$repo/.cudnn_frontend/include"
fi
start=$SECONDS
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=${MAX_JOBS:-2} ATTN_OPS_CUDA=1 \
  "$venv/bin/python" setup.py -q build_ext --inplace
echo "== built in $((SECONDS - start)) s"

lib=$(ls attn_ops/_C.cpython-*.so)
mkdir -p "$repo/.prebuilt"
rm -f "$repo"/.prebuilt/_C.*.so
strip --strip-debug -o "$repo/.prebuilt/$(basename "$lib")" "$lib"
"$venv/bin/python" "$repo/benchmarks/gpu/build_stamp.py" --arch-list "$arch" --root "$work/src" >"$repo/.prebuilt/stamp"
# The stamp is of the copy that was built; the tree sent must still be the same.
[[ $(cat "$repo/.prebuilt/stamp") == $("$venv/bin/python" "$repo/benchmarks/gpu/build_stamp.py" --arch-list "$arch") ]] \
  || { echo "the working tree changed during the build: run again" >&2; exit 1; }
ls -l "$repo/.prebuilt"
