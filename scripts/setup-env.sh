#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment in .venv with everything the
# build, the tests and the CPU benchmark need, all from PyPI: nvcc comes from the
# cuda-toolkit wheels, so no CUDA toolkit is needed on the machine.
# Usage: source scripts/setup-env.sh
set -e
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_py="${PYTHON:-python3}"
if [ ! -x "$_root/.venv/bin/python" ]; then
  "$_py" -m venv "$_root/.venv"
fi
# shellcheck disable=SC1091
source "$_root/.venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q \
  "maturin>=1.16,<2" \
  "cuda-toolkit[nvcc,cudart,crt,nvvm,cccl]==13.0.2" \
  "torch==2.11.0" numpy pytest hypothesis matplotlib tqdm mypy
NVCC="$(python - <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
for d in (spec.submodule_search_locations if spec else []):
    p = os.path.join(d, "cu13", "bin", "nvcc")
    if os.path.isfile(p):
        print(p)
        break
PY
)"
export NVCC
echo "setup-env: python $(python -c 'import sys; print(sys.version.split()[0])'), nvcc at ${NVCC:-<none>}"
set +e
