#!/usr/bin/env bash
# Sets up the environment, then runs every check: rustfmt, clippy, Rust unit tests, the
# package build (a wheel built by pip from pyproject.toml, which compiles every CUDA kernel
# with nvcc from PyPI), stubtest, pytest, and the vLLM plugin's tests against a real vLLM
# (scripts/test-vllm.sh; SWAPMOE_SKIP_VLLM=1 skips them). GPU tests are marked `gpu` and
# skip on a machine without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
set -euo pipefail

echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy (with and without the Python bindings)"
cargo clippy --all-targets -- -D warnings
cargo clippy --no-default-features --all-targets -- -D warnings
echo "== cargo test"
cargo test --no-default-features
echo "== pip wheel . (builds the extension and the CUDA kernels), then install it"
rm -f dist/swapmoe-*.whl
python -m pip wheel -q --no-deps -w dist .
python -m pip install -q --force-reinstall --no-deps dist/swapmoe-*.whl
python -c "import swapmoe; print('built:', swapmoe.build_info())"
echo "== stubtest (python/swapmoe/_core.pyi matches the extension)"
(cd /tmp && python -m mypy.stubtest swapmoe._core)
echo "== pytest"
# The package source lives in python/, so the installed package (with _core) is imported.
set +e
python -m pytest -q -p no:cacheprovider tests
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  echo "pytest failed with exit code $rc"
  exit "$rc"
fi
if [ "${SWAPMOE_SKIP_VLLM:-0}" = "1" ]; then
  echo "== vLLM plugin tests skipped (SWAPMOE_SKIP_VLLM=1)"
else
  bash scripts/test-vllm.sh
fi
