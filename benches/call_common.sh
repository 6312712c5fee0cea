# Sourced by the device-call scripts (benches/results/*/call_*.sh): the run's setup (strict
# variables, unbuffered Python, $OUT, the GPU's clocks and power in $OUT/gpu.txt) and its
# helpers:
#   el                         seconds since the call began
#   status NAME RC             prints "[el s] NAME: exit RC"; call it as `cmd; status NAME $?`
#                              (`echo "[$(el) s] NAME: exit $?"` prints the status of $(el), 0)
#   install_wheels NAME...     the wheel of each dist/NAME into its own /tmp/site_NAME (fails
#                              at the first that does not install)
#   gpu_pytest LOG WHEEL SECONDS PYTEST_ARGS...
#                              pytest with dist/WHEEL's install (install_wheels, or ab.sh's),
#                              killed after SECONDS ($TIMEOUT_SIGNAL, default TERM; KILL where a
#                              deadlock may ignore TERM), its log as $OUT/pytest_LOG.log (with
#                              the $PYTEST_DURATIONS slowest tests, default 15: the suite's time
#                              grew); prints its exit status, last line and failures, and
#                              returns the status
#   ab NAME WHEELS CASES ARGS TIMEOUT
#                              one benches/ab.sh run (two rounds; $BENCH_TIMEOUT s per bench,
#                              default 60), its log as $OUT/ab_NAME.txt and its summary
#                              (benches/ab_summary.py) as $OUT/ab_NAME_summary.txt and on stdout
#   bench_shapes QUANT MS [STOP]
#                              `swapmoe bench` of the three public shapes at token counts MS
#                              (none = bf16, else a --quant), each as $OUT/bench/bench_MODEL[_QUANT].txt
#                              and .json, with the wheel on $PYTHONPATH; skipped past STOP
#                              seconds (default 520)
#   sanitize_variants WHEEL SECONDS [STOP]
#                              compute-sanitizer memcheck, then racecheck, of every kernel variant
#                              (benches/sanitize_case.py) with dist/WHEEL's install, each killed
#                              after SECONDS, as $OUT/sanitize_TOOL.txt; a tool is skipped past STOP
#                              seconds of the call (default: never). Racecheck's 3 known bulk-copy
#                              hazards (NOTES) make its exit status 9
#   same_bits_swap BASE WHEEL  benches/same_bits.py --swap-only: saves dist/BASE's swap-AB
#                              outputs, then compares dist/WHEEL's with them bit for bit, as
#                              $OUT/bits_save.txt and $OUT/bits_compare.txt (150 s each)
#   sanitize_fp8_swap WHEEL SECONDS STOP
#                              compute-sanitizer memcheck, then racecheck, of 16 small FP8 swap-AB
#                              calls (test_swap_backend: every scheme, M = 1 and 5, no clusters and
#                              the widest) with dist/WHEEL's install, each killed after SECONDS or
#                              what is left before STOP seconds of the call, as
#                              $OUT/sanitize_fp8_TOOL.txt; a tool with under 40 s left is skipped
#   routing_bench WHEEL SECONDS ROUNDS
#                              benches/routing_bench.py (fused_moe - fused_experts, issue 3) at
#                              M = 1, 8, 64 with dist/WHEEL's install, as $OUT/routing_WHEEL.txt
#   tune_tables WHEEL TAG SECONDS STOP ARGS...
#                              `swapmoe tune ARGS --m 1,2,4,8,16,32,64 --force --no-vllm` with
#                              dist/WHEEL's install, its tables in $OUT/tables and its log as
#                              $OUT/logs/tune_TAG.txt, killed after SECONDS; skipped where fewer
#                              than SECONDS are left before STOP seconds of the call
#   with_routing_bench WHEEL MS MODEL...
#                              `swapmoe bench --with-routing` (paired rounds: moe-exp_us) of each
#                              MODEL at token counts MS with dist/WHEEL's install, as
#                              $OUT/bench/paired_MODEL.txt and .json
#   h200_call_min WHEEL D      on an H200 only ($OUT/gpu.txt): h200_2026-12-06/call_min.sh with
#                              dist/WHEEL's install in what is left of D seconds, then exits the
#                              call; elsewhere returns (the call's own steps follow)
#   $SPLIT_TESTS               pytest -k selection of the swap split GPU tests (bf16 and FP8,
#                              splits 1,1 to 8,8; in tests/test_gpu.py and tests/test_fp8_gpu.py)
#   pack PATTERN...            every file under $OUT but gpu.txt and the first 6 (sorted) that
#                              match a PATTERN (bash patterns on paths relative to $OUT, `*`
#                              crossing folders) into $OUT/raw.tgz, so that a call returns at
#                              most 8 files
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
status() { echo "[$(el) s] $1: exit $2"; }
install_wheels() {
  local w
  for w in "$@"; do
    rm -rf "/tmp/site_$w" && python3 -m pip install -q --no-index --no-deps --target "/tmp/site_$w" dist/"$w"/*.whl || return 1
  done
}
gpu_pytest() {
  local name=$1 log="$OUT/pytest_$1.log" wheel=$2 seconds=$3 rc
  shift 3
  PYTHONPATH=/tmp/site_$wheel timeout -s "${TIMEOUT_SIGNAL:-TERM}" "$seconds" python3 -m pytest -q -p no:cacheprovider -rfE \
    --durations="${PYTEST_DURATIONS:-15}" "$@" > "$log" 2>&1
  rc=$?
  echo "$(status "pytest $name ($wheel)" $rc) ; $(tail -1 "$log")"
  grep -E "^(FAILED|ERROR)" "$log" | head -20
  return $rc
}
ab() {
  OUT=$OUT/ab WHEELS="$2" CASES="$3" ARGS="$4" ROUNDS=2 BENCH_TIMEOUT=${BENCH_TIMEOUT:-60} timeout "$5" bash benches/ab.sh > /dev/null 2>&1
  mv "$OUT/ab/ab.txt" "$OUT/ab_$1.txt"; echo "[$(el) s] ab $1 done"
  python3 benches/ab_summary.py "$OUT/ab_$1.txt" | tee "$OUT/ab_$1_summary.txt"
}
bench_shapes() {
  local q="" tag="" model
  [ "$1" != none ] && q="--quant $1" && tag="_$1"
  mkdir -p "$OUT/bench"
  for model in qwen3-30b-a3b deepseek-v3-tp8 mixtral-8x7b; do
    [ $(el) -gt ${3:-520} ] && break
    timeout 90 python3 -m swapmoe bench --model $model --m $2 $q --no-progress \
      --json "$OUT/bench/bench_$model$tag.json" > "$OUT/bench/bench_$model$tag.txt" 2>&1
    status "bench $model $1" $?
    grep -E "^ +[0-9]+ " "$OUT/bench/bench_$model$tag.txt"
  done
}
sanitize_variants() {
  local tool
  for tool in memcheck racecheck; do
    [ $(el) -gt ${3:-999999} ] && break
    PYTHONPATH=/tmp/site_$1 timeout "$2" compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py \
      > "$OUT/sanitize_$tool.txt" 2>&1
    status "sanitize $tool ($1)" $?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|DIFFERENT|ALL OK" "$OUT/sanitize_$tool.txt"
  done
}
same_bits_swap() {
  PYTHONPATH=/tmp/site_$1 timeout 150 python3 benches/same_bits.py --swap-only --save /tmp/bits_$1.pt \
    > "$OUT/bits_save.txt" 2>&1
  status "same_bits save ($1)" $?
  PYTHONPATH=/tmp/site_$2 timeout 150 python3 benches/same_bits.py --swap-only --compare /tmp/bits_$1.pt \
    > "$OUT/bits_compare.txt" 2>&1
  status "same_bits compare ($2)" $?
  tail -3 "$OUT/bits_compare.txt"
}
sanitize_fp8_swap() {
  local tool left
  for tool in memcheck racecheck; do
    left=$(($3 - $(el) - 8))
    [ $left -lt 40 ] && break
    PYTHONPATH=/tmp/site_$1 timeout $((left < $2 ? left : $2)) compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_gpu.py \
      -k "test_swap_backend and (M1- or M5-) and (splits1x1 or splits8x8)" > "$OUT/sanitize_fp8_$tool.txt" 2>&1
    status "sanitize fp8 swap $tool ($1)" $?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitize_fp8_$tool.txt" | tail -3
  done
}
routing_bench() {
  PYTHONPATH=/tmp/site_$1 timeout "$2" python3 benches/routing_bench.py --m 1,8,64 --rounds "$3" > "$OUT/routing_$1.txt" 2>&1
  status "routing bench ($1)" $?
  grep -E "^(shape|qwen3|deepseek)" "$OUT/routing_$1.txt" | cut -c1-110
}
tune_tables() {
  local wheel=$1 tag=$2 s=$3 stop=$4
  shift 4
  [ $(el) -gt $((stop - s)) ] && { echo "[$(el) s] tune $tag skipped"; return; }
  mkdir -p "$OUT/tables" "$OUT/logs"
  PYTHONPATH=/tmp/site_$wheel timeout "$s" python3 -m swapmoe tune "$@" --m 1,2,4,8,16,32,64 --force --no-vllm \
    --out-dir "$OUT/tables" --no-progress > "$OUT/logs/tune_$tag.txt" 2>&1
  status "tune $tag" $?
  grep -E "^ *M=" "$OUT/logs/tune_$tag.txt" | cut -c1-120
}
with_routing_bench() {
  local wheel=$1 ms=$2 model
  shift 2
  mkdir -p "$OUT/bench"
  for model in "$@"; do
    PYTHONPATH=/tmp/site_$wheel timeout 120 python3 -m swapmoe bench --model "$model" --m "$ms" --with-routing \
      --no-baselines --no-read-floor --no-progress --json "$OUT/bench/paired_$model.json" \
      > "$OUT/bench/paired_$model.txt" 2>&1
    status "bench --with-routing $model" $?
    grep -E "^ *[0-9]+ |^ *M " "$OUT/bench/paired_$model.txt" | cut -c1-220
  done
}
h200_call_min() {
  grep -q H200 "$OUT/gpu.txt" || return 0
  WHEEL=$1 DEADLINE=$(($2 - $(el))) OUT=$OUT bash benches/results/h200_2026-12-06/call_min.sh
  exit
}
start_call() {  # WHEEL DEADLINE: the preamble of a device call that runs call_min.sh on an H200
  cat "$OUT/gpu.txt"
  export TIMEOUT_SIGNAL=KILL
  install_wheels "$1" || exit 1
  h200_call_min "$1" "$2"
}
SPLIT_TESTS="swap_gemm1_ring or swap_gemm2_ring or test_wgmma_swap_backend or test_wgmma_swap_gemm2_launch"
pack() {
  (
    cd "$OUT" || exit 1
    local list=/tmp/pack.list f p keep kept=0
    : > "$list"
    # gpu.txt and at most 6 more files stay out, in sorted order (the device returns 8 files:
    # those 7 and raw.tgz); every other file goes into raw.tgz
    while IFS= read -r f; do
      keep=0
      for p in gpu.txt "$@"; do [[ $f == $p ]] && keep=1; done
      if [ $keep = 1 ] && [ "$f" != gpu.txt ]; then
        kept=$((kept + 1)); [ $kept -le 6 ] || keep=0
      fi
      [ $keep = 1 ] || echo "$f" >> "$list"
    done < <(find . -type f -printf '%P\n' | sort)
    [ -s "$list" ] || exit 0
    tar czf /tmp/raw.tgz -T "$list" || exit 1
    xargs -d '\n' rm -f < "$list"
    find . -mindepth 1 -type d -empty -delete
    mv /tmp/raw.tgz raw.tgz
  )
  ls -R "$OUT"
}
