#!/usr/bin/env bash
# A/B of two or more wheels on the device, interleaved in one run (machines differ by more
# than most changes: compare within a run). Each entry of $WHEELS is a dist/ folder name
# (`bash benches/build_wheel.sh NAME [PATCH ...]` builds one here, before the call),
# optionally with environment settings for its runs ("new:SWAPMOE_X=1,SWAPMOE_Y=2"; a value may
# hold commas: "new:SWAPMOE_SWAP_SLICES=4,1,SWAPMOE_Y=2"); each
# wheel is installed into its own site folder; then for each round and each case, every
# entry runs `swapmoe bench` in turn. Logs to $OUT/ab.txt.
#   WHEELS="base new new:SWAPMOE_X=0" CASES="qwen3-30b-a3b:1,8 8,2,4096,2048:1" ARGS="--quant fp8_tensor" bash benches/ab.sh
# (a case is a preset model or an explicit shape E,topk,K,N, then its token counts)
# $TESTS (pytest arguments, shell-quoted: run with the last wheel, before the benches), $ROUNDS (default 2),
# $BENCH_TIMEOUT (s per bench, default 120), $TEST_TIMEOUT (s, default 300). A table entry the oracle sets
# aside ("cannot run") or a knob it ignores shows in ab.txt: an entry did not measure what its name says.
# `python3 benches/ab_summary.py $OUT/ab.txt` prints each case's rounds, means and differences.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WHEELS=${WHEELS:?names of dist/ folders, e.g. "base new"}
for w in $(for e in $WHEELS; do echo "${e%%:*}"; done | sort -u); do
  rm -rf /tmp/site_$w && python3 -m pip install -q --no-index --no-deps --target /tmp/site_$w dist/$w/*.whl || exit 1
done
last=${WHEELS##* }; last=${last%%:*}
if [ -n "${TESTS:-}" ]; then
  eval "PYTHONPATH=/tmp/site_$last timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider $TESTS" > "$OUT/pytest.txt" 2>&1
  echo "pytest ($last): exit $? ; $(tail -1 "$OUT/pytest.txt")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.txt" | head -20
fi
for round in $(seq 1 ${ROUNDS:-2}); do
  for c in ${CASES:-qwen3-30b-a3b:1,8}; do
    IFS=: read -r model ms <<< "$c"
    for entry in $WHEELS; do
      w=${entry%%:*}; vars=""; [ "$entry" != "$w" ] && vars=${entry#*:}
      echo "=== round $round $model M=$ms wheel=$entry ${ARGS:-}" | tee -a "$OUT/ab.txt"
      what="--model $model"; [[ $model == *,* ]] && what="--shape $model"  # a case "E,topk,K,N:M,..."
      # assignments split at the commas that start the next NAME= (values may hold commas)
      env $(sed -E 's/,([A-Za-z_][A-Za-z0-9_]*=)/ \1/g' <<< "$vars") PYTHONPATH=/tmp/site_$w timeout ${BENCH_TIMEOUT:-120} python3 -m swapmoe bench $what --m $ms \
        --no-check --no-baselines --no-progress ${ARGS:-} 2>&1 | grep -E '^ *[0-9]+ |rror|cannot run|ignored' | tee -a "$OUT/ab.txt"
    done
  done
done
