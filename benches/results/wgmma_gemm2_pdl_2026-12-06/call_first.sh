#!/usr/bin/env bash
# The first call of a session that holds both wheels (dist/main from main, dist/pdl from the
# PDL branch): on an H200, main's H200 call (README tables, sanitizers, routing tests); on
# any other GPU, the PDL branch's first call (its tests, the FP8 A/B):
#   run(command="OUT=$OUT bash benches/results/wgmma_gemm2_pdl_2026-12-06/call_first.sh", carry=["dist/main", "dist/pdl"])
# (call1.sh comes with the patch: run it from the patch's branch.) Ran 2026-12-06 16:10 on an
# H100 (call_first_out/).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  DEADLINE=555 exec bash benches/results/h200_2026-12-06/call_min.sh
fi
exec bash benches/results/wgmma_gemm2_pdl_2026-12-06/call1.sh
