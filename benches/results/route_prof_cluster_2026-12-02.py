"""ncu target: fused_moe at deepseek-v3-tp8 routing, M from argv, with the env's placement."""
import os, sys, torch, swapmoe
E, topk, K, N = 256, 8, 7168, 256
kw = dict(renormalize=True, scoring="sigmoid", num_expert_group=8, topk_group=4, routed_scaling_factor=2.5)
g = torch.Generator(device="cuda").manual_seed(0)
w1 = (torch.randn(E, 2 * N, K, device="cuda", generator=g) / K**0.5).to(torch.bfloat16)
w2 = (torch.randn(E, K, N, device="cuda", generator=g) / N**0.5).to(torch.bfloat16)
bias = torch.randn(E, device="cuda", generator=g) * 0.1
for M in [int(v) for v in sys.argv[1].split(",")]:
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(M, E, device="cuda", generator=g)
    for fusion in ("auto", "off"):
        os.environ["SWAPMOE_ROUTER_FUSION"] = fusion
        for _ in range(3):
            swapmoe.fused_moe(x, w1, w2, logits, topk, e_score_correction_bias=bias, **kw)
        torch.cuda.synchronize()
