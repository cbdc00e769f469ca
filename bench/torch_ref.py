#!/usr/bin/env python3
"""torch_ref: time the same training step as build/bench_step, in PyTorch float32.

    /usr/bin/python3 bench/torch_ref.py --config gpt2-124m|small|tiny|mini|... --batch B
                                        --seq T --steps N --threads K [--json]
                                        [--precision fp32|bf16] [--recompute none|full]

The model is ptrain's (/work/shared/fixtures/README.md section 3): pre-LN GPT-2,
tanh GELU, causal attention, LM head tied to wte, mean cross-entropy (or, for the
llama-* presets, LLaMA's: RMSNorm, rotary q and k, grouped key/value heads,
SwiGLU, an untied head, as Hugging Face's LlamaForCausalLM); then
torch.optim.AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D
tensors only, no clipping), i.e. bench_step's pt_adamw_default() and lr. It is
written the ordinary fast PyTorch way (nn.Linear, F.layer_norm, masked softmax
attention with matmuls, F.cross_entropy), so the times are what a PyTorch user
gets. Like bench_step it checks the result first (loss at init near ln V, lower
after one step on the batch; that step is the warm-up), times N steps, and
reports the median ms/step, tokens/s, MFU (same FLOP formula, over a torch.mm
peak measured in this process) and the peak RSS, with the same JSON keys.
--recompute full wraps each block in torch.utils.checkpoint (non-reentrant): a
block keeps only its input and runs its forward again in backward, as
bench_step --recompute full does; none (the default) is the ordinary step.

Needs Debian's python3-torch (1.13): use /usr/bin/python3 if the `python3` on
PATH is another interpreter without torch.
"""

import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# ptrain's presets (pt_gpt_config_preset in ptrain.h): name -> (V, block, L, NH, C)
PRESETS = {
    "tiny": (256, 128, 2, 4, 64),
    "mini": (256, 256, 4, 4, 128),
    "small": (8192, 512, 4, 4, 256),
    "gpt2-124m": (50257, 1024, 12, 12, 768),
    "gpt2-350m": (50257, 1024, 24, 16, 1024),
    "gpt2-774m": (50257, 1024, 36, 20, 1280),
    "gpt2-1558m": (50257, 1024, 48, 25, 1600),
}
# LLaMA presets: name -> (V, block, L, NH, C, key/value heads, SwiGLU hidden, rotary base)
LLAMA_PRESETS = {
    "llama-tiny": (256, 128, 2, 4, 64, 2, 176, 10000.0),
    "llama-124m": (32000, 1024, 12, 12, 768, 4, 2048, 10000.0),
}
LN_EPS = 1e-5


def run_blocks(blocks, full, x, *args):
    """x through each block; full: each under torch.utils.checkpoint (its input kept,
    its forward run again in backward)."""
    for blk in blocks:
        x = checkpoint(blk, x, *args, use_reentrant=False) if full else blk(x, *args)
    return x


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(LN(x)), then x + mlp(LN(x))."""

    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=LN_EPS)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)  # ptrain's attn.c_proj
        self.ln_2 = nn.LayerNorm(C, eps=LN_EPS)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)  # ptrain's mlp.c_proj

    def forward(self, x, mask):
        B, T, C = x.shape
        hd = C // self.NH
        # qkv columns are [q|k|v], each split into heads: [B, NH, T, hd]
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hd).transpose(1, 2)
        k = k.view(B, T, self.NH, hd).transpose(1, 2)
        v = v.view(B, T, self.NH, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = F.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, block, L, NH, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(block, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=LN_EPS)
        # True above the diagonal: key t' > query t is masked out
        self.register_buffer("mask", torch.triu(torch.ones(block, block, dtype=torch.bool), 1))
        # GPT-2 initialisation as ptrain's pt_gpt_init_weights: N(0, 0.02) for
        # matrices, 0.02/sqrt(2L) for the two c_proj ones, LN weights 1, biases 0
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            else:  # every 1-D weight is a LayerNorm one
                nn.init.constant_(p, 1.0 if name.endswith("weight") else 0.0)

    def forward(self, inputs, targets):
        T = inputs.shape[1]
        x = self.wte(inputs) + self.wpe.weight[:T]
        x = run_blocks(self.h, self.recompute_full, x, self.mask)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head, no bias
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w (torch 1.13 has no nn.RMSNorm)."""

    def __init__(self, C):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LN_EPS) * self.weight


def rotate(x, cos, sin):
    """Hugging Face LLaMA's rotary embedding: pairs (i, i + hd/2) rotated by t * theta^(-2i/hd)."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


class LlamaBlock(nn.Module):
    """x + o(attn(rope(q), rope(k), v) of RMSNorm(x)), then x + down(silu(gate) * up)."""

    def __init__(self, C, NH, KV, F):
        super().__init__()
        self.NH, self.KV, hd = NH, KV, C // NH
        self.input_layernorm = RMSNorm(C)
        self.q_proj = nn.Linear(C, C, bias=False)
        self.k_proj = nn.Linear(C, KV * hd, bias=False)
        self.v_proj = nn.Linear(C, KV * hd, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)
        self.post_attention_layernorm = RMSNorm(C)
        self.gate_proj = nn.Linear(C, F, bias=False)
        self.up_proj = nn.Linear(C, F, bias=False)
        self.down_proj = nn.Linear(F, C, bias=False)

    def forward(self, x, mask, cos, sin):
        B, T, C = x.shape
        hd = C // self.NH
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.NH, hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.KV, hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.KV, hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(self.NH // self.KV, dim=1)  # each key/value head serves a group
        v = v.repeat_interleave(self.NH // self.KV, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = F.softmax(att.masked_fill(mask[:T, :T], float("-inf")), dim=-1)
        x = x + self.o_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, V, block, L, NH, C, KV, Fh, theta):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([LlamaBlock(C, NH, KV, Fh) for _ in range(L)])
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)  # untied
        self.register_buffer("mask", torch.triu(torch.ones(block, block, dtype=torch.bool), 1))
        hd = C // NH
        inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.outer(torch.arange(block, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float())
        self.register_buffer("sin", ang.sin().float())
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, inputs, targets):
        T = inputs.shape[1]
        x = self.embed_tokens(inputs)
        cos, sin = self.cos[:T], self.sin[:T]
        x = run_blocks(self.layers, self.recompute_full, x, self.mask, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def mm_peak_gflops(n=1024, seconds=0.5):
    """Best single torch.mm rate on n x n float32 matrices, as pt_gemm_peak_gflops."""
    a = torch.arange(n * n, dtype=torch.float32).remainder(7).mul(0.01).view(n, n)
    b = torch.arange(n * n, dtype=torch.float32).remainder(5).mul(0.01).view(n, n)
    c = torch.empty(n, n)
    torch.mm(a, b, out=c)  # warm-up
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        dt = time.perf_counter() - t0
        if dt > 0:
            best = max(best, 2.0 * n * n * n / dt / 1e9)
    return best


def main():
    ap = argparse.ArgumentParser(description="PyTorch twin of build/bench_step")
    ap.add_argument("--config", default="small", choices=sorted(PRESETS) + sorted(LLAMA_PRESETS))
    ap.add_argument("--batch", type=int, default=8, help="B")
    ap.add_argument("--seq", type=int, default=128, help="T")
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="bf16: forward (and so backward) under torch.autocast(bfloat16), "
                         "fp32 weights and AdamW")
    ap.add_argument("--recompute", default="none", choices=("none", "full"),
                    help="full: each block under torch.utils.checkpoint")
    args = ap.parse_args()
    B, T, steps = args.batch, args.seq, args.steps
    if B < 1 or T < 1 or steps < 1:
        ap.error("--batch, --seq and --steps must be >= 1")

    threads = args.threads or os.cpu_count()
    torch.set_num_interop_threads(1)  # before any parallel work, or torch refuses
    torch.set_num_threads(threads)
    torch.manual_seed(7)

    if args.config in LLAMA_PRESETS:
        V, block, L, NH, C, KV, Fh, theta = LLAMA_PRESETS[args.config]
        block = max(block, T)
        model = Llama(V, block, L, NH, C, KV, Fh, theta)
        expect = 2 * V * C + L * (2 * C * C + 2 * C * KV * (C // NH) + 3 * C * Fh + 2 * C) + C
    else:
        V, block, L, NH, C = PRESETS[args.config]
        block = max(block, T)  # as bench_step: the position table covers T
        model = GPT(V, block, L, NH, C)
        expect = V * C + block * C + L * (12 * C * C + 13 * C) + 2 * C  # pt_gpt_num_params
    model.recompute_full = args.recompute == "full"
    params = sum(p.numel() for p in model.parameters())  # wte counted once where tied
    if params != expect:
        sys.exit(f"error: {params} parameters, ptrain has {expect}")
    # decoupled weight decay on 2-D tensors only, as ptrain (p->decay = ndim >= 2)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    inputs = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))

    bf16 = args.precision == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(inputs, targets)
        loss.backward()
        opt.step()
        return loss.item()

    # check: loss at init near ln V; one step on the batch lowers it (also the warm-up)
    loss0 = step()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss1 = model(inputs, targets).float().item()
    if not (abs(loss0 - math.log(V)) < 0.5 and loss1 < loss0):
        sys.exit(f"error: result check failed: loss {loss0:.4f} (ln V = {math.log(V):.4f}), "
                 f"then {loss1:.4f}")

    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[steps // 2] if steps % 2 else 0.5 * (times[steps // 2 - 1] + times[steps // 2])
    peak = mm_peak_gflops(1024, 0.5)
    # pt_gpt_flops_per_step: 6 x the parameters that multiply (not the lookup tables: wpe,
    # and LLaMA's untied embed_tokens), plus attention's scores and context
    lookup = V * C if args.config in LLAMA_PRESETS else block * C
    flops = 6.0 * (params - lookup) * B * T + 12.0 * L * C * B * T * T
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # ru_maxrss is KiB
    if args.json:
        print(json.dumps({
            "config": args.config, "batch": B, "seq": T, "threads": torch.get_num_threads(),
            "params": params, "steps": steps, "ms_per_step": round(med * 1e3, 3),
            "tokens_per_s": round(B * T / med, 1), "gflops_per_step": round(flops / 1e9, 4),
            "peak_gflops": round(peak, 1), "mfu": round(flops / med / (peak * 1e9), 4),
            "peak_rss_bytes": rss, "loss_check": [round(loss0, 4), round(loss1, 4)],
            "precision": args.precision, "recompute": args.recompute,
            "peak_rss_mib": round(rss / 2**20, 1), "torch": torch.__version__}))
    else:
        print(f"{args.config:<10} B={B:<3d} T={T:<4d} threads {torch.get_num_threads()} "
              f"{args.precision} recompute {args.recompute}: "
              f"{med * 1e3:9.1f} ms/step {B * T / med:9.0f} tok/s  "
              f"MFU {100 * flops / med / (peak * 1e9):5.1f}% of {peak:.0f} GFLOP/s  "
              f"peak RSS {rss / 1048576:.0f} MiB (torch {torch.__version__})")


if __name__ == "__main__":
    main()
