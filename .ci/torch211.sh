#!/usr/bin/env bash
# The oldest supported torch, 2.11 (the GPU machine's): builds the whole extension against it (CUDA sources
# too, when nvcc is found; TORCH_CUDA_ARCH_LIST defaults to 9.0) and runs the test suite. Not part of .ci/run
# (it would double CI's time); run it after changing C++ / CUDA code or anything traced by torch.compile.
#   bash .ci/torch211.sh [WORKDIR]      (default /tmp/attn_ops_torch211; tests the committed HEAD)
# torch 2.11 goes into a venv over this machine's packages (--no-deps): the rest (pytest, transformers, the
# CUDA libraries) comes from the `make test` environment.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:-/tmp/attn_ops_torch211}
mkdir -p "$work"
if ! [ -x "$work/venv/bin/python" ]; then
  python -m venv --system-site-packages "$work/venv"
fi
"$work/venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.startswith('2.11.'))" &&
  "$work/venv/bin/pip" install -q --no-deps torch==2.11.0
rm -rf "$work/src"
git clone -q "$repo" "$work/src"
cd "$work/src"
MAX_JOBS=${MAX_JOBS:-2} "$work/venv/bin/python" setup.py build_ext --inplace -q
"$work/venv/bin/python" -m pytest tests -q -p no:cacheprovider
