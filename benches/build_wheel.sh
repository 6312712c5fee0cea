#!/usr/bin/env bash
# Builds the wheel of a kernel variant for a device call: HEAD's committed tree with each
# PATCH applied (`git apply`), in a temporary git worktree, into dist/NAME/ (which a call
# carries). Without patches it builds HEAD itself (the usual A/B baseline, dist/main).
#
#   bash benches/build_wheel.sh NAME [PATCH ...]
#   e.g. bash benches/build_wheel.sh ahead benches/results/session_2026-12-07h/fp8_rows_ahead_unrolled.patch
#
# Variants are kept as patches under benches/results/ because only main lands: a branch of
# an earlier session is not in a fresh checkout. Each variant builds in its own cargo target
# (/tmp/swapmoe_target_NAME, a copy of main's /tmp/swapmoe_target_main when that exists, so
# that the crates are not compiled again); a build takes ~6 minutes on 2 cores, most of it nvcc.
# Needs maturin and nvcc: the active environment's if it has maturin, else scripts/setup-env.sh's.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash benches/build_wheel.sh NAME [PATCH ...]" >&2
  exit 2
fi
name=$1
shift
case "$name" in
  *[!A-Za-z0-9_-]* | "") echo "build_wheel: NAME must be letters, digits, _ or - (got '$name')" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
patches=()
for p in "$@"; do
  [ -f "$p" ] || { echo "build_wheel: no patch file '$p'" >&2; exit 2; }
  patches+=("$(cd "$(dirname "$p")" && pwd)/$(basename "$p")")
done
if ! command -v maturin > /dev/null; then
  # shellcheck disable=SC1091
  source "$root/scripts/setup-env.sh"
  set -euo pipefail
fi
tree="$(mktemp -d /tmp/swapmoe_wt_"$name".XXXXXX)"
cleanup() { git -C "$root" worktree remove --force "$tree" > /dev/null 2>&1 || rm -rf "$tree"; }
trap cleanup EXIT
git -C "$root" worktree add -q --detach "$tree" HEAD
for p in "${patches[@]}"; do
  git -C "$tree" apply --whitespace=nowarn "$p" || { echo "build_wheel: $p does not apply to HEAD" >&2; exit 1; }
done
target="/tmp/swapmoe_target_$name"
if [ ! -d "$target" ] && [ -d /tmp/swapmoe_target_main ]; then
  cp -r /tmp/swapmoe_target_main "$target"
fi
rm -rf "$root/dist/$name"
(cd "$tree" && CARGO_TARGET_DIR="$target" maturin build --release -q -o "$root/dist/$name")
echo "build_wheel: dist/$name/$(ls "$root/dist/$name") from $(git -C "$root" rev-parse --short HEAD)${patches[*]:+ + ${patches[*]##*/}}"
