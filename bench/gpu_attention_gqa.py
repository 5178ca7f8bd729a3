"""Grouped-query attention on one GPU: repeat_kv + SDPA against SDPA with enable_gqa.

Times forward + backward of causal scaled_dot_product_attention in bf16 at
the Llama-3.2-1B shape (micro-batch 8, 1024 tokens, 32 query heads, 8 kv
heads, head dim 64) two ways: k and v repeated to the query heads first
(transformers' repeat_kv: expand + reshape, what a trace records), and the
kv heads passed as they are with enable_gqa=True, for each SDPA backend
that takes the call. Prints milliseconds per iteration and the largest
difference of the output and the q/k/v gradients from the repeat_kv run.

usage: python3 bench/gpu_attention_gqa.py [--iters N]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def repeat_kv(x, n_rep):
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def run(q, k, v, go, gqa, backend, iters):
    def step():
        for t in (q, k, v):
            t.grad = None
        with sdpa_kernel([backend]):
            if gqa:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                n = q.shape[1] // k.shape[1]
                o = F.scaled_dot_product_attention(q, repeat_kv(k, n), repeat_kv(v, n), is_causal=True)
        o.backward(go)
        return o
    o = step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters, o.detach(), [t.grad.detach().clone() for t in (q, k, v)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    torch.manual_seed(0)
    B, S, H, KV, D = 8, 1024, 32, 8, 64
    opts = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(B, H, S, D, **opts, requires_grad=True)
    k = torch.randn(B, KV, S, D, **opts, requires_grad=True)
    v = torch.randn(B, KV, S, D, **opts, requires_grad=True)
    go = torch.randn(B, H, S, D, **opts)
    ref = None
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        for gqa in (False, True):
            name = f"{backend.name:20} {'enable_gqa' if gqa else 'repeat_kv':10}"
            try:
                ms, o, grads = run(q, k, v, go, gqa, backend, args.iters)
            except RuntimeError as e:
                print(f"{name}  not taken: {str(e).splitlines()[0][:100]}")
                continue
            if ref is None:
                ref = (o, grads)
            diff = max([(o.float() - ref[0].float()).abs().max().item()] +
                       [(g.float() - r.float()).abs().max().item() for g, r in zip(grads, ref[1])])
            print(f"{name}  {ms:7.3f} ms fwd+bwd  max diff {diff:.3g}")


if __name__ == "__main__":
    main()
