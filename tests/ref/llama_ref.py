#!/usr/bin/env python3
"""Float64 PyTorch reference for ptrain's LLaMA test fixtures ("ptrain-fixture-v1",
arch = llama: /work/shared/fixtures/README.md section 7).

A straightforward LLaMA module: RMSNorm before attention and MLP, rotary position
embeddings as Hugging Face's LlamaForCausalLM (rotate_half; optionally LLaMA 3's
frequency scaling), grouped-query attention by repeating each key/value head for
its group of query heads, a SwiGLU MLP, no position embedding, an untied (or tied)
LM head, optional biases (q, k, v, o and the three MLP projections). Parameters
use Hugging Face's names and nn.Linear [out, in] layout. The run protocol, AdamW,
float64 computation, float32 storage and the safetensors writer are those of
gpt2_ref.py (imported from beside this file).

Generate a fixture:

    /usr/bin/python3 tests/ref/llama_ref.py --out tests/fixtures/llama/llama_mqa.safetensors \\
        --vocab 53 --n-embd 48 --n-head 4 --n-kv-head 1 --ffn 80 --n-layer 3 --tie 1 --seed 5

Check this script against an existing fixture (recompute from its own weights):

    /usr/bin/python3 tests/ref/llama_ref.py --check /work/shared/fixtures/llama/llama_tiny.safetensors
"""

import argparse
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref  # noqa: E402  (AdamW, run protocol, safetensors I/O)

SCRIPT = "tests/ref/llama_ref.py"


def param_shapes(cfg):
    """Ordered (name, shape) of every parameter, nn.Linear [out, in]."""
    V, C, L, F = cfg["vocab_size"], cfg["n_embd"], cfg["n_layer"], cfg["ffn_hidden"]
    hd = C // cfg["n_head"]
    Q, KV = cfg["n_head"] * hd, cfg["n_kv_head"] * hd
    bias = cfg["bias"]
    shapes = [("model.embed_tokens.weight", [V, C])]
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.append((p + "input_layernorm.weight", [C]))
        for name, out in (("q_proj", Q), ("k_proj", KV), ("v_proj", KV)):
            shapes.append((p + f"self_attn.{name}.weight", [out, C]))
        if bias:
            shapes += [(p + "self_attn.q_proj.bias", [Q]), (p + "self_attn.k_proj.bias", [KV]),
                       (p + "self_attn.v_proj.bias", [KV])]
        shapes.append((p + "self_attn.o_proj.weight", [C, Q]))
        if bias:
            shapes.append((p + "self_attn.o_proj.bias", [C]))
        shapes.append((p + "post_attention_layernorm.weight", [C]))
        shapes += [(p + "mlp.gate_proj.weight", [F, C]), (p + "mlp.up_proj.weight", [F, C])]
        if bias:
            shapes += [(p + "mlp.gate_proj.bias", [F]), (p + "mlp.up_proj.bias", [F])]
        shapes.append((p + "mlp.down_proj.weight", [C, F]))
        if bias:
            shapes.append((p + "mlp.down_proj.bias", [C]))
    shapes.append(("model.norm.weight", [C]))
    if not cfg["tie"]:
        shapes.append(("lm_head.weight", [V, C]))
    return shapes


def init_params(cfg, gen):
    """normal(0, 0.02); o_proj, down_proj normal(0, 0.02/sqrt(2 L)); norm weights
    1 + uniform(-a, a); biases uniform(-a, a)."""
    std, a = 0.02, cfg["init_perturb"]
    proj_std = std / math.sqrt(2 * cfg["n_layer"])
    params = {}
    for name, shape in param_shapes(cfg):
        if len(shape) >= 2:
            s = proj_std if ("o_proj" in name or "down_proj" in name) else std
            params[name] = torch.normal(0.0, s, size=shape, generator=gen, dtype=torch.float64)
        else:
            base = 1.0 if "norm" in name else 0.0
            params[name] = base + torch.rand(shape, generator=gen, dtype=torch.float64) * (2 * a) - a
    return params


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def inv_freq(cfg, hd):
    """theta^(-2j/hd), j < hd/2; LLaMA 3's scaling as transformers'
    _compute_llama3_parameters when rope_scaling_factor > 0."""
    f = cfg["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    factor = cfg["rope_scaling_factor"]
    if factor > 0:
        lo, hi, ctx = cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"], cfg["rope_original_max_pos"]
        wavelen = 2 * math.pi / f
        scaled = torch.where(wavelen > ctx / lo, f / factor, f)
        smooth = (ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < ctx / hi) & ~(wavelen > ctx / lo)
        f = torch.where(medium, smoothed, scaled)
    return f


def rotate_half(u):
    h = u.shape[-1] // 2
    return torch.cat((-u[..., h:], u[..., :h]), dim=-1)


def linear(x, params, name):
    y = x @ params[name + ".weight"].t()
    b = params.get(name + ".bias")
    return y if b is None else y + b


def forward(params, cfg, inputs, targets):
    B, T = inputs.shape
    C, NH, NKV = cfg["n_embd"], cfg["n_head"], cfg["n_kv_head"]
    hd, eps = C // NH, cfg["norm_eps"]
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq(cfg, hd)[None, :]
    ang = torch.cat((ang, ang), dim=-1)  # f[j] = f[j + hd/2]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x = params["model.embed_tokens.weight"][inputs]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, params[p + "input_layernorm.weight"], eps)
        q = linear(h, params, p + "self_attn.q_proj").reshape(B, T, NH, hd).transpose(1, 2)
        k = linear(h, params, p + "self_attn.k_proj").reshape(B, T, NKV, hd).transpose(1, 2)
        v = linear(h, params, p + "self_attn.v_proj").reshape(B, T, NKV, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)  # query head j reads kv head j // group
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        y = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v
        x = x + linear(y.transpose(1, 2).reshape(B, T, NH * hd), params, p + "self_attn.o_proj")
        h2 = rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        g, u = linear(h2, params, p + "mlp.gate_proj"), linear(h2, params, p + "mlp.up_proj")
        x = x + linear(g * torch.sigmoid(g) * u, params, p + "mlp.down_proj")
    head = params["model.embed_tokens.weight" if cfg["tie"] else "lm_head.weight"]
    logits = rms_norm(x, params["model.norm.weight"], eps) @ head.t()
    flat = logits.reshape(B * T, -1)
    nll = torch.logsumexp(flat, dim=-1) - flat.gather(1, targets.reshape(-1, 1)).squeeze(1)
    return logits, nll.mean()


INT_KEYS = ["n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden", "vocab_size", "block_size",
            "B", "T", "steps"]
FLOAT_KEYS = ["lr", "beta1", "beta2", "eps", "weight_decay"]
SCALING_KEYS = ["rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor"]


def make_metadata(cfg):
    md = {"format": gpt2_ref.FORMAT, "arch": "llama"}
    md.update({k: str(cfg[k]) for k in INT_KEYS})
    md.update({k: repr(float(cfg[k])) for k in FLOAT_KEYS})
    md.update({"decay": "dim>=2", "norm": "rmsnorm", "norm_eps": repr(float(cfg["norm_eps"])),
               "rope_theta": repr(float(cfg["rope_theta"])), "rope": "rotate_half", "mlp": "swiglu",
               "tie_embeddings": str(int(cfg["tie"])), "bias": str(int(cfg["bias"]))})
    if cfg["rope_scaling_factor"] > 0:
        md.update({k: repr(float(cfg[k])) for k in SCALING_KEYS})
        md["rope_original_max_pos"] = str(cfg["rope_original_max_pos"])
    md.update({"seed": str(cfg["seed"]), "init_perturb": repr(float(cfg["init_perturb"])),
               "loss": "mean cross-entropy over B*T", "reference_precision": "float64",
               "generator": gpt2_ref.generator_string().replace(gpt2_ref.SCRIPT, SCRIPT)})
    return md


def use_llama():
    """gpt2_ref's protocol (run, loss_and_grads) with this file's model."""
    gpt2_ref.forward = forward
    gpt2_ref.param_shapes = param_shapes


def generate(args):
    cfg = vars(args).copy()
    cfg.update(vocab_size=args.vocab, ffn_hidden=args.ffn)
    if cfg["n_embd"] % cfg["n_head"] or cfg["n_head"] % cfg["n_kv_head"] or (cfg["n_embd"] // cfg["n_head"]) % 2:
        sys.exit("error: need n_head | n_embd, n_kv_head | n_head and an even head size")
    if not 1 <= cfg["T"] <= cfg["block_size"]:
        sys.exit("error: need 1 <= T <= block_size")
    use_llama()
    gen = torch.Generator().manual_seed(cfg["seed"])
    params = init_params(cfg, gen)
    params = {n: p.to(torch.float32).to(torch.float64) for n, p in params.items()}
    inputs = torch.randint(0, cfg["vocab_size"], (cfg["B"], cfg["T"]), generator=gen)
    targets = torch.randint(0, cfg["vocab_size"], (cfg["B"], cfg["T"]), generator=gen)
    res = gpt2_ref.run(params, cfg, inputs, targets)
    gpt2_ref.write_safetensors(args.out, gpt2_ref.fixture_tensors(cfg, params, inputs, targets, res),
                               make_metadata(cfg))
    losses = ", ".join(f"{x:.6f}" for x in res["losses"].tolist())
    print(f"wrote {args.out}: loss {res['loss'].item():.6f}, losses [{losses}]")


def check(path):
    """Recomputes a LLaMA fixture from its own weights, inputs and targets."""
    md, t = gpt2_ref.read_safetensors(path)
    if md.get("arch") != "llama":
        sys.exit(f"error: {path}: arch is {md.get('arch')!r}, expected 'llama'")
    cfg = {k: int(md[k]) for k in INT_KEYS}
    cfg.update({k: float(md[k]) for k in FLOAT_KEYS})
    cfg.update(norm_eps=float(md["norm_eps"]), rope_theta=float(md["rope_theta"]),
               tie=int(md["tie_embeddings"]), bias=int(md["bias"]))
    for k in SCALING_KEYS:
        cfg[k] = float(md.get(k, "0"))
    cfg["rope_original_max_pos"] = int(md.get("rope_original_max_pos", "0"))
    use_llama()
    names = [n for n, _ in param_shapes(cfg)]
    params = {n: torch.from_numpy(t[n]).to(torch.float64) for n in names}
    res = gpt2_ref.run(params, cfg, torch.from_numpy(t["fixture.inputs"]).long(),
                       torch.from_numpy(t["fixture.targets"]).long())
    worst = 0.0
    for label, ours, name in [("logits", res["logits"], "fixture.logits"), ("loss", res["loss"], "fixture.loss"),
                              ("losses", res["losses"], "fixture.losses")] + \
            [(f"grad {n}", res["grads"][n], f"fixture.grad.{n}") for n in names] + \
            [(f"final {n}", res["final"][n], f"fixture.final.{n}") for n in names]:
        ref = t[name].astype(np.float64)
        d = float(np.max(np.abs(ours.detach().numpy().reshape(ref.shape) - ref)))
        m = float(np.max(np.abs(ref)))
        worst = max(worst, d / m if m > 0 else d)
    ok = worst < 1e-6  # independent float64 runs rounded to float32: ~1 ulp
    print(f"{path}: worst difference relative to each quantity's max {worst:.2e}: {'OK' if ok else 'MISMATCH'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=97)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-kv-head", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=160, help="SwiGLU hidden size")
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--rope-scaling-factor", type=float, default=0.0, help="LLaMA 3 scaling (0: none)")
    ap.add_argument("--rope-low-freq-factor", type=float, default=1.0)
    ap.add_argument("--rope-high-freq-factor", type=float, default=4.0)
    ap.add_argument("--rope-original-max-pos", type=int, default=8192)
    ap.add_argument("--tie", type=int, default=0, choices=[0, 1])
    ap.add_argument("--bias", type=int, default=0, choices=[0, 1])
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--init-perturb", type=float, default=0.1)
    ap.add_argument("--out")
    ap.add_argument("--check", metavar="FILE", nargs="+")
    args = ap.parse_args()
    if args.check:
        sys.exit(0 if all([check(p) for p in args.check]) else 1)
    if not args.out:
        ap.error("--out is required (or use --check FILE)")
    generate(args)


if __name__ == "__main__":
    main()
