#!/usr/bin/env bash
# One device session's batch: install the wheel carried in dist/ (or in $WHEEL_DIR, e.g.
# dist/new), then run what the arguments name (smoke, sanitize, pytest, bench). Logs go to $OUT.
# The device tool returns at most 8 files from $OUT (device README, Limits): PACK_OUT=1 packs
# everything under $OUT into $OUT/out.tgz at the end when there are more (ncu-source writes 7
# files per pair of cases, ktimes one per case).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
rm -rf /tmp/site && python3 -m pip install -q --no-index --no-deps --target /tmp/site ${WHEEL_DIR:-dist}/*.whl || exit 1
export PYTHONPATH=/tmp/site
# The environment of benches/profile_case.py for one case: PROFILE_QUANT=$1 (none: bf16, no
# variable) and PROFILE_BACKENDS=$2, with the router's kernels left out.
profile_env() { [ "$1" != none ] && echo "PROFILE_QUANT=$1"; echo "PROFILE_BACKENDS=$2 PROFILE_ROUTER=0"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
for step in "$@"; do
  echo "=== $step ($(date +%T))"
  case "$step" in
    smoke) python3 benches/gpu_smoke.py ${SMOKE_M:-1,8,64,1024} 2>&1 | tee "$OUT/smoke.txt" ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py > "$OUT/sanitize_$tool.txt" 2>&1
        echo "compute-sanitizer $tool: exit $? ; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ALL OK|FAILED' "$OUT/sanitize_$tool.txt" | tr '\n' ' ')"
      done ;;
    sanitize-fp8)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider tests/test_fp8_gpu.py -k "${SAN_FP8_K:-test_decode_sizes and uniform and (tensor-1- or channel-5- or block-3-) or test_prefill}" > "$OUT/sanitize_fp8_$tool.txt" 2>&1
        echo "compute-sanitizer $tool (fp8): exit $? ; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/sanitize_fp8_$tool.txt" | tr '\n' ' ')"
      done ;;
    bench-qwen) python3 -m swapmoe bench --model qwen3-30b-a3b --m ${BENCH_M:-1,2,4,8,16,32,64} --json "$OUT/bench_qwen.json" --plot "$OUT/bench_qwen.png" 2>&1 | tee "$OUT/bench_qwen.txt" | tail -40 ;;
    bench-all)
      # file names get the --quant of BENCH_ARGS (bench_<model>_<quant>.*); unquantized runs keep bench_<model>.*
      quant=none
      if [[ " ${BENCH_ARGS:-} " =~ [[:space:]]--quant[=[:space:]]+([a-z0-9_]+) ]]; then quant=${BASH_REMATCH[1]}; fi
      tag=""; [ "$quant" != none ] && tag="_$quant"
      for model in ${BENCH_MODELS:-qwen3-30b-a3b deepseek-v3-tp8 mixtral-8x7b}; do
        name="bench_$model$tag"
        python3 -m swapmoe bench --model $model --m ${BENCH_M:-1,2,4,8,16,32,64,1024,4096} ${BENCH_ARGS:-} --json "$OUT/$name.json" --plot "$OUT/$name.png" 2>&1 | tee "$OUT/$name.txt" | tail -30
      done ;;
    tune)
      # tuned tables for the public shapes, into $OUT/tables.tgz (unpack into python/swapmoe/tables/)
      # $TUNE_RESUME: a tables.tgz of an earlier step to continue (tune skips the M points in it);
      # $TUNE_TIMEOUT (s) stops tune early enough for the tar below to run inside the call's limit
      mkdir -p "$OUT/tables"
      [ -n "${TUNE_RESUME:-}" ] && tar xzf "$TUNE_RESUME" -C "$OUT"
      timeout ${TUNE_TIMEOUT:-540} python3 -m swapmoe tune --model ${TUNE_MODELS:-qwen3-30b-a3b,deepseek-v3-tp8,mixtral-8x7b} \
        --m ${TUNE_M:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096} --out-dir "$OUT/tables" --no-progress ${TUNE_ARGS:-} \
        2>&1 | tee -a "$OUT/tune.txt" | tail -60
      # the device tool returns no file whose name has ';' or '=' (the table names): tar them
      tar czf "$OUT/tables.tgz" -C "$OUT" tables && rm -rf "$OUT/tables" ;;
    ncu-decode)
      # kernels of benches/profile_case.py at qwen3 M=${PROFILE_M:-1}: speed of light, memory, warp stalls
      ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section LaunchStats --section Occupancy -k regex:'decode|bulk|route' \
        python3 benches/profile_case.py ${PROFILE_M:-1} ${PROFILE_SHAPE:-qwen3} > "$OUT/ncu_decode_${PROFILE_SHAPE:-qwen3}.txt" 2>&1
      echo "ncu: exit $? ; $(grep -c 'decode_moe\|bulk_moe' "$OUT/ncu_decode_${PROFILE_SHAPE:-qwen3}.txt") kernel sections" ;;
    stamps)
      # per-CTA timeline of the swap kernels: needs a profiling wheel in dist/stamps/
      # (SWAPMOE_CUDA_STAMPS=1 maturin build --release -o dist/stamps); cases
      # "shape:M[:splits[:quant]]", e.g. "mixtral:1::fp8_tensor" (the FP8 swap kernels)
      rm -rf /tmp/site_stamps && python3 -m pip install -q --no-index --no-deps --target /tmp/site_stamps dist/stamps/*.whl || exit 1
      for c in ${STAMPS_CASES:-qwen3:1 deepseek:1 deepseek:8 qwen3:8}; do
        IFS=: read -r shape m splits quant <<< "$c"
        echo "=== $c" >> "$OUT/stamps.txt"
        PYTHONPATH=/tmp/site_stamps python3 benches/stamps.py --shape $shape --m $m ${splits:+--splits $splits} ${quant:+--quant $quant} \
          --json "$OUT/stamps_raw.json.gz" >> "$OUT/stamps.txt" 2>&1
        echo "stamps $c: exit $?"
      done ;;
    swap-sweep) python3 benches/swap_sweep.py --m ${SWEEP_M:-1,4,16,64} 2>&1 | tee "$OUT/swap_sweep.txt" ;;
    ncu-swap)
      # the swap-AB kernels per ($PROFILE_SHAPE, M, splits) in $NCU_SWAP_CASES, e.g. "qwen3:1:1,4 deepseek:1:4,2"
      for c in ${NCU_SWAP_CASES:-qwen3:1:1,4 qwen3:1:2,4 deepseek:1:4,2 qwen3:64:2,4}; do
        IFS=: read -r shape m splits <<< "$c"
        SWAPMOE_SWAP_SPLITS=$splits PROFILE_BACKENDS=cuda_wgmma_swap PROFILE_ROUTER=0 ncu --clock-control none \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
          --section Occupancy -k regex:'swap|decode' python3 benches/profile_case.py $m $shape > "/tmp/ncu_swap_${shape}_m${m}_${splits/,/x}.txt" 2>&1
        echo "ncu $c: exit $?"
      done
      tar czf "$OUT/ncu_swap.tgz" -C /tmp $(cd /tmp && ls ncu_swap_*.txt) ;;
    ncu-fp8)
      # the FP8 kernels of benches/profile_case.py, for $PROFILE_QUANT at each M of $NCU_FP8_M on $PROFILE_SHAPE
      for m in ${NCU_FP8_M:-1 8}; do
        PROFILE_QUANT=${PROFILE_QUANT:-fp8_tensor} PROFILE_BACKENDS=${PROFILE_BACKENDS:-cuda_wgmma_swap} PROFILE_ROUTER=0 \
          ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy \
          -k regex:'fp8|swap' python3 benches/profile_case.py $m ${PROFILE_SHAPE:-qwen3} > "$OUT/ncu_fp8_m$m.txt" 2>&1
        echo "ncu fp8 M=$m: exit $?"; grep -E "swap_moe|swapmoe_fp8|Duration|DRAM Throughput|Registers Per|Grid Size" "$OUT/ncu_fp8_m$m.txt" | head -40
      done ;;
    ncu-wgmma)
      # the prefill wgmma GEMMs per "shape:M:quant" of $NCU_WGMMA_CASES (quant none = bf16): speed of
      # light, compute (tensor pipe), shared memory, warp stalls; a summary to stdout
      for c in ${NCU_WGMMA_CASES:-mixtral:4096:fp8_tensor mixtral:4096:none}; do
        IFS=: read -r shape m quant <<< "$c"
        f="/tmp/ncu_wgmma_${shape}_m${m}_${quant}.txt"
        env $(profile_env "$quant" cuda_wgmma) \
          ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
          --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats \
          --section Occupancy -k regex:'wgmma_moe_.*gemm' -c 4 python3 benches/profile_case.py $m $shape > "$f" 2>&1
        echo "ncu $c: exit $?"
        grep -E "wgmma_moe_|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Local Memory|Shared Memory Throughput|Issue Slots Busy|No Eligible|Stall|Tensor" "$f" | head -60
      done
      tar czf "$OUT/ncu_wgmma.tgz" -C /tmp $(cd /tmp && ls ncu_wgmma_*.txt) ;;
    clocks)
      # SM clock, power and the driver's clock-event reasons (nvidia-smi every 100 ms) while
      # `swapmoe bench` times each "model:M:quant" of $CLOCKS_CASES (quant none = bf16) in its
      # CUDA graphs: whether a sustained layer runs at the clock ncu's single kernels see.
      f="$OUT/clocks.csv"; fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
      nvidia-smi --query-gpu=$fields,clocks_event_reasons.active --format=csv,noheader -lms 100 > "$f" 2>&1 &
      smi=$!; sleep 1
      if ! kill -0 $smi 2>/dev/null; then  # older drivers name the reasons clocks_throttle_reasons
        nvidia-smi --query-gpu=$fields,clocks_throttle_reasons.active --format=csv,noheader -lms 100 > "$f" 2>&1 &
        smi=$!; sleep 1
      fi
      for c in ${CLOCKS_CASES:-qwen3-30b-a3b:4096:fp8_tensor}; do
        IFS=: read -r model m quant <<< "$c"
        q=""; [ "$quant" != none ] && q="--quant $quant"
        echo "$(date +%T.%N | cut -c1-12) start $c" >> "$OUT/clocks_marks.txt"
        python3 -m swapmoe bench --model $model --m $m $q --no-check --no-baselines --no-progress 2>&1 | grep -E '^ *[0-9]+ '
        echo "$(date +%T.%N | cut -c1-12) end $c" >> "$OUT/clocks_marks.txt"
      done
      sleep 1; kill $smi
      python3 - "$f" <<'PY' | tee "$OUT/clocks.txt"
import collections, statistics, sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 5]
busy = [r for r in rows if r[3].endswith(" W") and float(r[3][:-2]) > 300]  # the layer running
if not busy:
    print(f"no sample above 300 W of {len(rows)}")
else:
    mhz = sorted(int(r[1].split()[0]) for r in busy)
    watts = sorted(float(r[3][:-2]) for r in busy)
    print(f"busy samples {len(busy)} of {len(rows)}: SM MHz {mhz[0]} / {statistics.median(mhz):.0f} / {mhz[-1]},"
          f" W {watts[0]:.0f} / {statistics.median(watts):.0f} / {watts[-1]:.0f} (min / median / max)")
    for reason, n in collections.Counter(r[5].strip() for r in busy).most_common():
        print(f"  clock event reasons {reason}: {n} samples")
PY
      ;;
    ktimes)
      # per-kernel durations of the default plan (ncu, one metric; caches flushed before each
      # kernel) per "shape:M:quant" of $KTIMES_CASES (quant none = bf16); summary to stdout.
      # KTIMES_METRICS=dram adds the DRAM bytes each kernel reads and writes.
      metrics=gpu__time_duration.sum
      [ "${KTIMES_METRICS:-}" = dram ] && metrics=$metrics,dram__bytes_read.sum,dram__bytes_write.sum
      for c in ${KTIMES_CASES:-qwen3:4096:none deepseek:4096:none qwen3:4096:fp8_tensor}; do
        IFS=: read -r shape m quant <<< "$c"
        f="$OUT/ktimes_${shape}_${m}_${quant}.csv"
        env $(profile_env "$quant" oracle) \
          ncu --clock-control none --metrics $metrics --csv python3 benches/profile_case.py $m $shape > "$f" 2>&1
        echo "ncu $c: exit $?"; python3 benches/kernel_times.py "$f"
      done ;;
    ncu-source)
      # per-SASS-line instructions executed and warp-stall samples of one kernel per
      # "shape:M:quant" of $NCU_SOURCE_CASES (quant none = bf16), the first launch whose name
      # matches $NCU_SOURCE_KERNEL (a regex); each page as $OUT/source_<shape>_<M>_<quant>.csv and
      # its summary (benches/ncu_source.py) as .txt; two cases are also compared.
      pages=()
      for c in ${NCU_SOURCE_CASES:-deepseek:4096:fp8_tensor deepseek:4096:fp8_channel}; do
        IFS=: read -r shape m quant <<< "$c"
        f="$OUT/source_${shape}_${m}_${quant}"
        env $(profile_env "$quant" oracle) \
          ncu --clock-control none --section SourceCounters --section WarpStateStats --section InstructionStats \
          --import-source no -k regex:"${NCU_SOURCE_KERNEL:-wgmma_moe_fp8_gemm2}" -c 1 -f -o "$f" \
          python3 benches/profile_case.py $m $shape > "$f.log" 2>&1
        echo "ncu $c: exit $?"
        ncu -i "$f.ncu-rep" --page source --csv --print-source sass > "$f.csv" && rm -f "$f.ncu-rep"
        python3 benches/ncu_source.py "$f.csv" > "$f.txt" && head -1 "$f.txt"
        pages+=("$f.csv")
      done
      [ ${#pages[@]} -eq 2 ] && python3 benches/ncu_source.py "${pages[@]}" > "$OUT/source_compared.txt" \
        && sed -n '1,30p' "$OUT/source_compared.txt" ;;
    routing) python3 benches/routing_bench.py --m ${ROUTING_M:-1,8,64} --json "$OUT/routing.json" 2>&1 | tee "$OUT/routing.txt" ;;
    pytest) python3 -m pytest -m gpu -q -p no:cacheprovider ${PYTEST_FILES:-tests} 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -25 ;;
    pytest-all) python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_all.txt" | tail -25 ;;
    pytest-fp8|pytest-rest)
      # the whole GPU suite no longer fits one 10-minute call (~1700 tests): run it in two calls,
      # the FP8 file (~610 tests) and the others (~980). Tests marked `serial` (persistent grids,
      # reruns, graphs: ~70) take ~2.6 s each alone but stall when many processes share the GPU
      # (none of them finished in ~490 s under 16 workers, 2026-12-03), so they run alone after
      # the rest, which runs over $PYTEST_WORKERS processes (pytest-xdist is on the device image;
      # the wgmma/prefill selection's other 275 tests took 50 s over 16). The FP8 file's ~750
      # non-serial tests no longer finish in one call either (749 in 375 s, 2026-12-04): give
      # $PYTEST_K ("wgmma", then "not wgmma") to run it as two calls.
      if [ "$step" = pytest-fp8 ]; then files=tests/test_fp8_gpu.py; else files=$(ls tests/test_*gpu*.py | grep -v test_fp8_gpu.py); fi
      kargs=(); [ -n "${PYTEST_K:-}" ] && kargs=(-k "$PYTEST_K")
      timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m "gpu and not serial" "${kargs[@]}" -q -p no:cacheprovider -n ${PYTEST_WORKERS:-16} -rfE $files > "$OUT/$step.txt" 2>&1
      echo "$step: exit $? ; $(tail -1 "$OUT/$step.txt")"
      grep -E "^(FAILED|ERROR)" "$OUT/$step.txt" | head -30
      timeout ${SERIAL_TIMEOUT:-240} python3 -m pytest -m "gpu and serial" "${kargs[@]}" -q -p no:cacheprovider -rfE $files > "$OUT/${step}_serial.txt" 2>&1
      echo "$step (serial): exit $? ; $(tail -1 "$OUT/${step}_serial.txt")"
      grep -E "^(FAILED|ERROR)" "$OUT/${step}_serial.txt" | head -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
if [ "${PACK_OUT:-0}" = 1 ]; then
  files=$(find "$OUT" -type f | wc -l)
  if [ "$files" -gt 8 ]; then
    tar czf /tmp/device_run_out.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/device_run_out.tgz "$OUT/out.tgz" \
      && echo "packed the $files files of \$OUT into \$OUT/out.tgz"
  fi
fi
