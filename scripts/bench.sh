#!/usr/bin/env bash
# Sets up the environment, installs swapmoe, and runs the main job: `swapmoe bench`.
# On a machine with a CUDA GPU it times the GPU kernels; without one it runs the CPU
# path on a small shape and says so. Extra arguments go to `swapmoe bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-env.sh
set -euo pipefail
python -m pip install -q --force-reinstall --no-deps .
swapmoe bench "$@"
