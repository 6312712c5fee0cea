#!/usr/bin/env bash
# The vLLM plugin's integration tests, against a real vLLM from PyPI in its own virtual
# environment (vLLM pins its own torch, which differs from the main test environment's).
# The environment is cached in $SWAPMOE_VLLM_VENV (default ~/.cache/swapmoe/vllm-<version>)
# and reused while it holds the pinned vLLM: the first install takes ~10 minutes and ~9 GB.
# Usage: bash scripts/test-vllm.sh [WHEEL]   (default: the wheel scripts/test.sh built in dist/)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
VLLM_VERSION=0.33.0
venv="${SWAPMOE_VLLM_VENV:-$HOME/.cache/swapmoe/vllm-$VLLM_VERSION}"
py="${PYTHON:-python3}"

if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$VLLM_VERSION')" 2>/dev/null; then
  echo "== creating $venv with vllm==$VLLM_VERSION (first run only)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "vllm==$VLLM_VERSION"
fi
"$venv/bin/python" -m pip install -q pytest hypothesis

wheel="${1:-$(ls -t "$root"/dist/swapmoe-*.whl 2>/dev/null | head -n 1)}"
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "test-vllm: no swapmoe wheel given and none in dist/ (run scripts/test.sh first)" >&2
  exit 2
fi
echo "== installing $(basename "$wheel") into the vLLM environment"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
"$venv/bin/python" -c "import vllm, torch, swapmoe; print('vllm', vllm.__version__, 'torch', torch.__version__, 'swapmoe', swapmoe.__version__)"
echo "== pytest tests/test_vllm_plugin.py (real vLLM $VLLM_VERSION)"
# From outside the checkout, so the installed package (with _core) is imported.
cd /tmp
"$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root" "$root/tests/test_vllm_plugin.py"
