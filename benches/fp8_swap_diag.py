"""Reproduces an FP8 GPU test's data (tests/conftest.py seeding) and compares the swap-AB
kernels with the SIMT decode kernels and the float64 reference: which rows and columns differ."""
import sys

import numpy as np
import torch

sys.path.insert(0, "tests")
from conftest import Case, fp8_call, fp8_reference, make_fp8_problem, seed_for, to_f64, to_fp8_inputs  # noqa: E402
from swapmoe.reference import rel_error_with_flips  # noqa: E402

CASES = {
    "tests/test_fp8_gpu.py::test_plan_picks_fp8_kernels": (Case(M=1, E=128, topk=8, N=128, K=256, out="poison"), "tensor", False),
    "tests/test_fp8_gpu.py::test_per_tensor_routing[3-E=16-topk=1-on_input=True-static]":
        (Case(M=3, E=16, topk=1, N=128, K=256, out="poison", on_input=True), "tensor", True),
}
for nodeid, (case, scheme, static) in CASES.items():
    rng = np.random.default_rng(seed_for(nodeid))
    prob = make_fp8_problem(rng, case, scheme, static=static)
    inp = to_fp8_inputs(prob, case, "torch", "bfloat16", "cuda")
    ref, flips = fp8_reference(inp, case)
    outs = {b: to_f64(fp8_call(inp, case, backend=b)) for b in ("cuda_wgmma_swap", "cuda_decode", "cuda_generic")}
    print(nodeid, "ids", to_f64(inp["ids"]).astype(int).tolist(), "tw", np.round(to_f64(inp["tw"]), 3).tolist())
    for b, o in outs.items():
        print(f"  {b}: rel err {rel_error_with_flips(o, ref, flips):.3g}")
    d = np.abs(outs["cuda_wgmma_swap"] - outs["cuda_decode"])
    rows = np.argwhere(d > 0.02 * np.abs(ref).max())
    print("  swap vs decode: max", d.max(), "count", len(rows), "tokens", sorted(set(rows[:, 0].tolist()))[:10],
          "cols (first)", rows[:12, 1].tolist())
    print("  swap, decode, reference at the first:",
          [(outs["cuda_wgmma_swap"][tuple(r)], outs["cuda_decode"][tuple(r)], ref[tuple(r)]) for r in rows[:4]])

# The intermediate (f32 [S, N], the same workspace region in both paths): swap against decode.
import swapmoe  # noqa: E402
from swapmoe import _core  # noqa: E402

nodeid = "tests/test_fp8_gpu.py::test_plan_picks_fp8_kernels"
case, scheme, static = CASES[nodeid]
rng = np.random.default_rng(seed_for(nodeid))
inp = to_fp8_inputs(make_fp8_problem(rng, case, scheme, static=static), case, "torch", "bfloat16", "cuda")
nbytes = swapmoe.workspace_bytes(inp["x"], inp["w1"], inp["ids"], "fp8_tensor")
spaces = {}
for b in ("cuda_wgmma_swap", "cuda_decode"):
    ws = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(inp["x"])
    _core.fused_experts(inp["x"], inp["w1"], inp["w2"], inp["tw"], inp["ids"], out, workspace=ws,
                        stream=torch.cuda.current_stream().cuda_stream, backend=b, use_fp8_w8a8=True,
                        w1_scale=inp["w1_scale"], w2_scale=inp["w2_scale"])
    torch.cuda.synchronize()
    spaces[b] = ws[: nbytes // 4 * 4].view(torch.float32).cpu().numpy().astype(np.float64)
a, d = spaces["cuda_wgmma_swap"], spaces["cuda_decode"]
both = np.isfinite(a) & np.isfinite(d)
rel = np.abs(a - d) / np.maximum(np.abs(d), 1e-3)
bad = np.flatnonzero(both & (rel > 1e-3))
print("workspace floats finite in both:", both.sum(), "differing > 1e-3:", len(bad))
for i in bad[:12]:
    print(f"  [{i}] swap {a[i]:.6g} decode {d[i]:.6g}")
