"""Times cuda_wgmma_swap with each cluster split ($SWAPMOE_SWAP_SPLITS = "g1,g2": GEMM1's K
split, GEMM2's expert split) and K slices per stage ($SWAPMOE_SWAP_SLICES) against the
oracle's choices and cuda_decode, the way
`swapmoe tune` times candidates (graph of 8 layers on distinct weights, L2 flushed, do_bench
median). Every timed configuration is first checked against float64.

    python3 benches/swap_sweep.py [--model qwen3-30b-a3b,...] [--m 1,4,16,64] [--configs 1,4/4,4 ...]
"""

import argparse
import os
import sys

import torch

from swapmoe import bench as B
from swapmoe import tune as T

#: "splits/slices": $SWAPMOE_SWAP_SPLITS / $SWAPMOE_SWAP_SLICES, "oracle" leaves one unset
CONFIGS = ["oracle/oracle", "oracle/1,1", "oracle/1,4", "oracle/4,4", "1,1/oracle", "1,4/oracle", "2,2/oracle",
           "2,4/oracle", "4,2/oracle", "4,4/oracle"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-30b-a3b,deepseek-v3-tp8,mixtral-8x7b")
    ap.add_argument("--m", default="1,4,16,64")
    ap.add_argument("--configs", nargs="*", default=CONFIGS)
    a = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    runner = T.GpuRunner(torch, dev, "bf16", 8, 0, props.name, (props.major, props.minor), None,
                         lambda s: print(s, file=sys.stderr))
    for name in a.model.split(","):
        shape = B.preset_shape(name)
        runner.start_shape(shape)
        for M in B.parse_m_list(a.m):
            inputs = runner.inputs(shape, M)
            row = {}
            for label in ("cuda_decode", "cuda_wgmma_swap"):
                configs = a.configs if label == "cuda_wgmma_swap" else ["-"]
                for cfg in configs:
                    sp, _, sl = cfg.partition("/")
                    for env, v in (("SWAPMOE_SWAP_SPLITS", sp), ("SWAPMOE_SWAP_SLICES", sl)):
                        if v in ("oracle", "-", ""):
                            os.environ.pop(env, None)
                        else:
                            os.environ[env] = v
                    key = label if cfg == "-" else f"swap {cfg}"
                    with T.forced(label):
                        bad = runner.check([label], inputs)[label]
                        if bad:
                            row[key] = f"FAIL {bad[:80]}"
                            continue
                        us, _ = runner.time_us(label, inputs)
                        row[key] = f"{us:.1f}"
            os.environ.pop("SWAPMOE_SWAP_SPLITS", None)
            os.environ.pop("SWAPMOE_SWAP_SLICES", None)
            print(f"{name} M={M}: " + "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        runner.end_shape()
    return 0


if __name__ == "__main__":
    sys.exit(main())
