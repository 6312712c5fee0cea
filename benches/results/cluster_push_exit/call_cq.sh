#!/usr/bin/env bash
# The push-form cluster sum on the device (issues 3, 5, 6), ~8 minutes with the start:
#   head = main before the push form (64f0a57's swap kernels), main = 134bfa3 (push form landed),
#   cxq  = exp/cluster-push-exit (b444f29): the push form without the last cluster barrier
#   built on the CPU machine: maturin build --release -o dist/main (main); git worktree add
#     /tmp/Bq exp/cluster-push-exit; (cd /tmp/Bq && CARGO_TARGET_DIR=/tmp/Bq_target maturin build
#     --release -o /work/main/dist/cxq)
#   run(command="OUT=$OUT bash benches/results/cluster_push_exit/call_cq.sh", carry=["dist/head", "dist/main", "dist/cxq"])
# 1. The 224 swap GPU tests with splits on cxq; the routing GPU tests on main (issue 3's kernels
#    with the landed router, on whatever card comes).
# 2. Decode A/B head / main / cxq, two rounds.
# 3. The swap splits with the cheaper cluster sum: each decode point's default (the oracle's,
#    H200 tables) against GEMM1's and GEMM2's cluster doubled, forced by SWAPMOE_SWAP_SPLITS.
# 4. compute-sanitizer memcheck and racecheck on cxq.
# 5. On an H200 (then the sweep is FP8 only): call_tables.sh's decode tables and routing bench on main.
source benches/call_common.sh
D=${DEADLINE:-540}  # the call packs and ends by about D seconds
cat "$OUT/gpu.txt"
export TIMEOUT_SIGNAL=KILL
install_wheels head main cxq || exit 1
SPLIT_TESTS="test_swap_gemm1_ring or test_swap_gemm2_ring or test_wgmma_swap_backend or test_wgmma_swap_gemm2_launch"
gpu_pytest cxq_swap cxq 75 -m "gpu and not serial" -k "$SPLIT_TESTS" -n 16 tests/test_gpu.py tests/test_fp8_gpu.py
cxq_ok=$?
gpu_pytest main_routing main 75 -m gpu -n 16 tests/test_routing_gpu.py tests/test_routing_fused_gpu.py
if [ $cxq_ok = 0 ]; then ENTRIES="head main cxq"; else ENTRIES="head main"; fi
BENCH_TIMEOUT=40 ab cq_fp8 "$ENTRIES" "qwen3-30b-a3b:1,2,8 deepseek-v3-tp8:1,8" "--quant fp8_tensor --no-read-floor" 150
BENCH_TIMEOUT=40 ab cq_bf16 "$ENTRIES" "qwen3-30b-a3b:1,8 deepseek-v3-tp8:1,8" "--no-read-floor" 110
S=SWAPMOE_SWAP_SPLITS
# defaults (the oracle, H200, bf16 and fp8 alike): qwen3 M=1 (2,4), M=2-8 (1,4); deepseek M=1 (4,2), M=2 (2,2), M=4-8 (1,2)
QS="fp8_tensor bf16"; grep -q H200 "$OUT/gpu.txt" && QS=fp8_tensor
for q in $QS; do
  args="--no-read-floor"; [ $q = fp8_tensor ] && args="--quant fp8_tensor --no-read-floor"
  [ $(el) -gt $((D - 140)) ] && break
  BENCH_TIMEOUT=30 ab sw_${q}_q1 "main main:$S=4,4 main:$S=2,8" "qwen3-30b-a3b:1" "$args" 60
  BENCH_TIMEOUT=30 ab sw_${q}_q2 "main main:$S=2,4 main:$S=1,8" "qwen3-30b-a3b:2,4,8" "$args" 70
  BENCH_TIMEOUT=30 ab sw_${q}_d1 "main main:$S=8,2 main:$S=4,4" "deepseek-v3-tp8:1" "$args" 60
  BENCH_TIMEOUT=30 ab sw_${q}_d4 "main main:$S=2,2 main:$S=1,4" "deepseek-v3-tp8:4,8" "$args" 70
done
for tool in memcheck racecheck; do
  [ $cxq_ok = 0 ] || break
  [ $(el) -gt $((D - 110)) ] && break
  PYTHONPATH=/tmp/site_cxq timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 python3 benches/sanitize_case.py > "$OUT/sanitize_$tool.txt" 2>&1
  status "sanitize $tool (cxq)" $?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|DIFFERENT|ALL OK" "$OUT/sanitize_$tool.txt"
done
# On an H200: the README's decode tables and issue 3's routing table with main (call_tables.sh's steps)
if grep -q H200 "$OUT/gpu.txt"; then
  export PYTHONPATH=/tmp/site_main
  mkdir -p "$OUT/bench"
  for q in none fp8_tensor; do
    for model in qwen3-30b-a3b deepseek-v3-tp8 mixtral-8x7b; do
      [ $(el) -gt $((D - 45)) ] && break
      tag=""; qa=""; [ $q != none ] && tag="_$q" && qa="--quant $q"
      timeout 45 python3 -m swapmoe bench --model $model --m 1,2,4,8,16,32,64 $qa --no-progress --no-read-floor \
        --json "$OUT/bench/bench_$model$tag.json" > "$OUT/bench/bench_$model$tag.txt" 2>&1
      status "bench $model $q" $?
      grep -E "^ +[0-9]+ " "$OUT/bench/bench_$model$tag.txt" | cut -c1-150
    done
  done
  if [ $(el) -lt $((D - 40)) ]; then
    timeout 40 python3 benches/routing_bench.py --m 1,8,64 --rounds 2 > "$OUT/routing_main.txt" 2>&1
    status "routing main" $?
    grep -E "^(shape|qwen3|deepseek)" "$OUT/routing_main.txt" | cut -c1-110
  fi
fi
pack 'ab_cq_*_summary.txt' 'pytest_*.log'  # at most 8 files come back: the rest goes in raw.tgz
echo "[$(el) s] end"
