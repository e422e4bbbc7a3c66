#!/usr/bin/env bash
# Configure, build and run the LibTorch (C++) tests of attn_ops with CMake + CTest: the GoogleTest tests
# (tests/cpp) and the example program (examples/cpp, the CTest test example.decode_step).
#
#   .ci/cpp_tests.sh [BUILD_DIR] [extra cmake -D options...]
#
# BUILD_DIR defaults to $ATTN_OPS_CPP_BUILD_DIR or build-cmake/ in the repository (git-ignored).
# Environment: PYTHON (default python; its torch provides the LibTorch CMake config), JOBS (default 2),
#   ATTN_OPS_CUDA (ON/OFF, default OFF), CMAKE_GENERATOR (default Ninja when ninja is installed, else Unix
#   Makefiles).
# Needs GoogleTest: apt-get update && apt-get install -y libgtest-dev
# Fails when the configure, the build or any test fails, and when no test ran.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-${ATTN_OPS_CPP_BUILD_DIR:-$repo/build-cmake}}"
[[ $# -gt 0 ]] && shift
python="${PYTHON:-python}"
jobs="${JOBS:-2}"

torch_prefix="$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"

generator="${CMAKE_GENERATOR:-}"
if [[ -z "$generator" ]]; then
  if command -v ninja >/dev/null 2>&1; then generator=Ninja; else generator="Unix Makefiles"; fi
fi

start=$SECONDS
echo "== configure ($generator) -> $build_dir"
cmake -S "$repo" -B "$build_dir" -G "$generator" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DATTN_OPS_CUDA="${ATTN_OPS_CUDA:-OFF}" \
  -DATTN_OPS_BUILD_TESTS=ON \
  -DATTN_OPS_BUILD_EXAMPLES=ON \
  "$@"

echo "== build (-j$jobs)"
cmake --build "$build_dir" --parallel "$jobs"

echo "== test"
ctest_log="$build_dir/ctest-output.log"
set +e
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error 2>&1 | tee "$ctest_log"
rc=${PIPESTATUS[0]}
set -e
if [[ $rc -ne 0 ]]; then
  echo "C++ tests FAILED (ctest exit code $rc)" >&2
  exit "$rc"
fi
# --no-tests=error already fails on an empty test list; check the summary too (older CTest, discovery mishaps).
if ! grep -Eq '100% tests passed, 0 tests failed out of [1-9][0-9]*' "$ctest_log"; then
  echo "C++ tests FAILED: no tests ran, or the summary line is missing" >&2
  exit 1
fi
echo "== C++ tests passed in $((SECONDS - start)) s"
