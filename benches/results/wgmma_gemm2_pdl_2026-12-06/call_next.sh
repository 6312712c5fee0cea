#!/usr/bin/env bash
# On an H200: main's H200 call (README tables, sanitizers, routing tests); elsewhere call_split.sh:
#   run(command="OUT=$OUT bash benches/results/wgmma_gemm2_pdl_2026-12-06/call_next.sh", carry=["dist/main", "dist/pdlx"])
# Ran 2026-12-06 16:58 naming nvidia-h200; an H100 came, so it ran call_split.sh.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  DEADLINE=555 exec bash benches/results/h200_2026-12-06/call_min.sh
fi
exec bash benches/results/wgmma_gemm2_pdl_2026-12-06/call_split.sh
