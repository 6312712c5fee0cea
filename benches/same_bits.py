"""Saves (--save F) or compares (--compare F) the outputs of a fixed set of calls on fixed
random inputs: cuda_wgmma at both token tiles (FP8 in every scheme, and bf16 with fp32 and
bf16 router weights and with the weights on the input), and cuda_wgmma_swap at decode sizes
(every FP8 scheme and bf16, each with the oracle's clusters and with "1,1" and "8,8"):
whether a kernel change that should only move timing (a schedule, a barrier, a pipeline)
leaves every bit of the result as it was.
Run it once per wheel (PYTHONPATH) on the same device.

    python benches/same_bits.py --save old.pt ; python benches/same_bits.py --compare old.pt

--swap-only runs only the cuda_wgmma_swap calls (a third of the time).
"""

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import (Case, call, fp8_call, make_fp8_problem, make_problem, to_fp8_inputs,  # noqa: E402
                      to_inputs, wgmma_fp8_case)

SCHEMES = [("tensor", False), ("tensor", True), ("channel", False), ("block", False)]
CASES = [Case(M=300, E=16, topk=4, N=256, K=512, out="poison", ids="concentrated"),
         Case(M=1200, E=8, topk=2, N=384, K=1024, out="poison", ep=True),
         Case(M=77, E=8, topk=2, N=128, K=336, out="poison", act="gelu")]
BF16_CASES = [Case(M=300, E=16, topk=4, N=256, K=512, ids="concentrated", act="gelu"),
              Case(M=1200, E=8, topk=2, N=384, K=1024, ep=True, tw_dtype="bfloat16"),
              Case(M=500, E=8, topk=1, N=128, K=256, on_input=True)]
# Decode sizes for the swap-AB kernels: every token tile (8/16/32/64), N and K tails, ragged
# and idle experts, the expert map with -1.
SWAP_CASES = [Case(M=1, E=32, topk=8, N=256, K=1024, out="poison"),
              Case(M=5, E=16, topk=4, N=256, K=512, ids="concentrated", out="poison"),
              Case(M=17, E=8, topk=2, N=80, K=336, ids="dup", act="gelu"),
              Case(M=40, E=16, topk=4, N=256, K=512, ep=True, out="poison"),
              Case(M=64, E=64, topk=6, N=256, K=512)]
SWAP_SPLITS = [None, "1,1", "8,8"]  # None: the oracle's clusters


def outputs(swap_only: bool = False) -> dict:
    got = {}
    for tile in () if swap_only else (64, 128):
        os.environ["SWAPMOE_MMA_TOKEN_TILE"] = str(tile)
        for scheme, static in SCHEMES:
            for i, case in enumerate(CASES):
                rng = np.random.default_rng(1000 + i)
                case = wgmma_fp8_case(case, scheme)
                prob = make_fp8_problem(rng, case, scheme, static=static)
                inp = to_fp8_inputs(prob, case, "torch", "bfloat16", "cuda")
                out = fp8_call(inp, case, backend="cuda_wgmma")
                got[f"t{tile}/{scheme}{'-static' if static else ''}/{i}"] = out.detach().cpu().clone()
        for i, case in enumerate(BF16_CASES):
            rng = np.random.default_rng(2000 + i)
            inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", "cuda")
            got[f"t{tile}/bf16/{i}"] = call(inp, case, backend="cuda_wgmma").detach().cpu().clone()
    os.environ.pop("SWAPMOE_MMA_TOKEN_TILE", None)
    for splits in SWAP_SPLITS:
        if splits:
            os.environ["SWAPMOE_SWAP_SPLITS"] = splits
        for i, case in enumerate(SWAP_CASES):
            for scheme, static in SCHEMES:
                rng = np.random.default_rng(3000 + i)
                prob = make_fp8_problem(rng, case, scheme, static=static)
                inp = to_fp8_inputs(prob, case, "torch", "bfloat16", "cuda")
                out = fp8_call(inp, case, backend="cuda_wgmma_swap")
                got[f"swap{splits or ''}/{scheme}{'-static' if static else ''}/{i}"] = out.detach().cpu().clone()
            rng = np.random.default_rng(4000 + i)
            inp = to_inputs(make_problem(rng, case), case, "torch", "bfloat16", "cuda")
            got[f"swap{splits or ''}/bf16/{i}"] = call(inp, case, backend="cuda_wgmma_swap").detach().cpu().clone()
        os.environ.pop("SWAPMOE_SWAP_SPLITS", None)
    torch.cuda.synchronize()
    return got


def main():
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save")
    g.add_argument("--compare")
    ap.add_argument("--swap-only", action="store_true", help="only the cuda_wgmma_swap calls")
    a = ap.parse_args()
    got = outputs(a.swap_only)
    if a.save:
        torch.save(got, a.save)
        print(f"saved {len(got)} outputs")
        return
    ref = torch.load(a.compare)
    missing = [k for k in ref if k not in got]
    if missing:
        sys.exit(f"outputs saved but not computed now: {missing}")
    bad = [k for k in ref if not torch.equal(ref[k].view(torch.int16), got[k].view(torch.int16))]
    nan = [k for k in got if torch.isnan(got[k].float()).any()]
    print(f"{len(ref)} outputs compared: {len(ref) - len(bad)} bit-identical; differing: {bad}; with NaN: {nan}")
    sys.exit(1 if bad or nan else 0)


if __name__ == "__main__":
    main()
