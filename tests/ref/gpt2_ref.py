#!/usr/bin/env python3
"""Float64 PyTorch reference for ptrain's GPT-2 test fixtures ("ptrain-fixture-v1").

The script builds a small GPT-2 (pre-LN blocks, tanh GELU, causal attention with
the [q|k|v][head][hd] column layout, LM head tied to wte, mean cross-entropy),
initialises it GPT-2 style with every bias and LayerNorm parameter perturbed by
uniform noise, draws random inputs and *independent* random targets, and records:

  * the initial parameters (Hugging Face names, Conv1D [in, out] layout),
  * logits, loss and gradients at the initial parameters,
  * the loss before each of `steps` AdamW updates (torch.optim.AdamW semantics,
    decoupled weight decay only for tensors with ndim >= 2),
  * the parameters after the last update.

Everything is computed in float64, then rounded to float32 (int32 for tokens) and
written as a safetensors file by hand (no `safetensors` package needed). The
format is described in /work/shared/fixtures/README.md.

Requirements: Debian's python3-torch and python3-numpy
(`apt-get install python3-torch python3-numpy`). Use /usr/bin/python3 if the
`python3` on PATH is another interpreter without torch.

Generate a fixture:

    /usr/bin/python3 tests/ref/gpt2_ref.py --out tests/fixtures/gpt2_odd.safetensors \\
        --vocab 67 --n-embd 24 --n-head 3 --n-layer 3 --block-size 24 \\
        --B 3 --T 11 --steps 6 --lr 2e-3 --beta2 0.999 --weight-decay 0.05 --seed 3

Check this script against an existing fixture (recompute everything from the
fixture's own initial weights, inputs and targets and print max differences):

    /usr/bin/python3 tests/ref/gpt2_ref.py --check /work/shared/fixtures/gpt2_tiny.safetensors
"""

import argparse
import json
import math
import struct
import subprocess
import sys

import numpy as np
import torch

FORMAT = "ptrain-fixture-v1"
SCRIPT = "tests/ref/gpt2_ref.py"

# ---------------------------------------------------------------------------
# Model description
# ---------------------------------------------------------------------------

LAYER_PARAMS = [  # per-layer parameters in canonical order; shape as a function of C
    ("ln_1.weight", lambda C: [C]),
    ("ln_1.bias", lambda C: [C]),
    ("attn.c_attn.weight", lambda C: [C, 3 * C]),
    ("attn.c_attn.bias", lambda C: [3 * C]),
    ("attn.c_proj.weight", lambda C: [C, C]),
    ("attn.c_proj.bias", lambda C: [C]),
    ("ln_2.weight", lambda C: [C]),
    ("ln_2.bias", lambda C: [C]),
    ("mlp.c_fc.weight", lambda C: [C, 4 * C]),
    ("mlp.c_fc.bias", lambda C: [4 * C]),
    ("mlp.c_proj.weight", lambda C: [4 * C, C]),
    ("mlp.c_proj.bias", lambda C: [C]),
]


def param_shapes(cfg):
    """Ordered list of (name, shape) for all model parameters."""
    V, C, L = cfg["vocab_size"], cfg["n_embd"], cfg["n_layer"]
    shapes = [("wte.weight", [V, C]), ("wpe.weight", [cfg["block_size"], C])]
    for i in range(L):
        shapes += [(f"h.{i}.{name}", shape(C)) for name, shape in LAYER_PARAMS]
    shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    return shapes


def init_params(cfg, gen):
    """GPT-2 initialisation (README section 4), in float64.

    normal(0, 0.02) for wte, wpe, c_attn.W, c_fc.W; normal(0, 0.02/sqrt(2*n_layer))
    for both c_proj.W; biases 0, LN weights 1, LN biases 0; then every bias and
    every LN weight/bias gets uniform(-init_perturb, init_perturb) noise.
    """
    std = 0.02
    proj_std = std / math.sqrt(2 * cfg["n_layer"])
    a = cfg["init_perturb"]
    params = {}
    for name, shape in param_shapes(cfg):
        if len(shape) >= 2:
            s = proj_std if name.endswith("c_proj.weight") else std
            t = torch.normal(0.0, s, size=shape, generator=gen, dtype=torch.float64)
        else:
            base = 1.0 if (".ln_" in name or name.startswith("ln_")) and name.endswith(".weight") else 0.0
            noise = torch.rand(shape, generator=gen, dtype=torch.float64) * (2 * a) - a
            t = base + noise
        params[name] = t
    return params


# ---------------------------------------------------------------------------
# Forward pass (README section 3.1); gradients come from autograd
# ---------------------------------------------------------------------------


def layer_norm(x, w, b, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_tanh(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))


def attention(a, W, bias, n_head):
    """Causal self-attention; qkv columns are laid out [q|k|v][head][hd]."""
    B, T, C = a.shape
    hd = C // n_head
    qkv = a @ W + bias  # Conv1D: y = x @ W + b, W is [in, out]
    q, k, v = qkv.split(C, dim=-1)
    # [B, T, C] -> [B, n_head, T, hd]; head h owns columns h*hd .. h*hd+hd-1
    q, k, v = (z.reshape(B, T, n_head, hd).transpose(1, 2) for z in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    y = p @ v  # [B, n_head, T, hd]
    return y.transpose(1, 2).reshape(B, T, C)


def forward(params, cfg, inputs, targets):
    """Returns (logits [B,T,V], mean loss scalar)."""
    B, T = inputs.shape
    eps = cfg["ln_eps"]
    wte = params["wte.weight"]
    x = wte[inputs] + params["wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        P = lambda name: params[f"h.{i}.{name}"]
        a = layer_norm(x, P("ln_1.weight"), P("ln_1.bias"), eps)
        y = attention(a, P("attn.c_attn.weight"), P("attn.c_attn.bias"), cfg["n_head"])
        x = x + (y @ P("attn.c_proj.weight") + P("attn.c_proj.bias"))
        a2 = layer_norm(x, P("ln_2.weight"), P("ln_2.bias"), eps)
        h = gelu_tanh(a2 @ P("mlp.c_fc.weight") + P("mlp.c_fc.bias"))
        x = x + (h @ P("mlp.c_proj.weight") + P("mlp.c_proj.bias"))
    xf = layer_norm(x, params["ln_f.weight"], params["ln_f.bias"], eps)
    logits = xf @ wte.t()  # tied LM head, no bias
    flat = logits.reshape(B * T, -1)
    nll = torch.logsumexp(flat, dim=-1) - flat.gather(1, targets.reshape(-1, 1)).squeeze(1)
    return logits, nll.mean()


def loss_and_grads(params, cfg, inputs, targets):
    """Forward + backward at `params` (float64). Gradients are fresh every call."""
    leaves = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    logits, loss = forward(leaves, cfg, inputs, targets)
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])
    return logits.detach(), loss.detach(), dict(zip(names, grads))


# ---------------------------------------------------------------------------
# AdamW (README section 3.3), written out by hand in float64
# ---------------------------------------------------------------------------


class AdamW:
    def __init__(self, params, lr, beta1, beta2, eps, weight_decay):
        self.lr, self.beta1, self.beta2 = lr, beta1, beta2
        self.eps, self.wd = eps, weight_decay
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}
        self.t = 0

    def step(self, params, grads):
        self.t += 1
        bc1 = 1.0 - self.beta1**self.t  # Python floats: double precision
        bc2 = 1.0 - self.beta2**self.t
        for n, p in params.items():
            g = grads[n]
            if p.dim() >= 2:  # decoupled decay, applied first to the pre-update p
                p = p * (1.0 - self.lr * self.wd)
            self.m[n] = self.beta1 * self.m[n] + (1.0 - self.beta1) * g
            self.v[n] = self.beta2 * self.v[n] + (1.0 - self.beta2) * g * g
            denom = torch.sqrt(self.v[n]) / math.sqrt(bc2) + self.eps  # eps after correction
            params[n] = p - (self.lr / bc1) * self.m[n] / denom


def run(params, cfg, inputs, targets):
    """Run protocol of README section 3.4. Returns a dict of float64 results."""
    params = {n: p.clone() for n, p in params.items()}
    opt = AdamW(params, cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["weight_decay"])
    losses = []
    for s in range(cfg["steps"]):
        logits, loss, grads = loss_and_grads(params, cfg, inputs, targets)
        losses.append(loss.item())
        if s == 0:
            logits0, loss0, grads0 = logits, loss, grads
        opt.step(params, grads)
    return {
        "logits": logits0,
        "loss": loss0.reshape(1),
        "grads": grads0,
        "losses": torch.tensor(losses, dtype=torch.float64),
        "final": params,
    }


# ---------------------------------------------------------------------------
# safetensors I/O
# ---------------------------------------------------------------------------

DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4")}


def write_safetensors(path, tensors, metadata):
    """tensors: ordered list of (name, dtype 'F32'|'I32', numpy-compatible array)."""
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, dtype, value in tensors:
        arr = np.ascontiguousarray(np.asarray(value), dtype=DTYPES[dtype])
        data = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # pad so the data buffer is 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def read_safetensors(path):
    """Returns (metadata dict, {name: numpy array}) keeping the file's tensor order."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    metadata = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(raw[base + begin : base + end], dtype=DTYPES[info["dtype"]])
        tensors[name] = arr.reshape(info["shape"]).copy()
    return metadata, tensors


# ---------------------------------------------------------------------------
# Fixture assembly
# ---------------------------------------------------------------------------

INT_KEYS = ["n_layer", "n_head", "n_embd", "vocab_size", "block_size", "B", "T", "steps"]
FLOAT_KEYS = ["lr", "beta1", "beta2", "eps", "weight_decay"]


def generator_string():
    debian = ""
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "python3-torch"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if out:
            debian = f" (Debian python3-torch {out})"
    except (OSError, subprocess.CalledProcessError):
        pass
    return f"pytorch {torch.__version__}{debian}, {SCRIPT}"


def make_metadata(cfg):
    md = {"format": FORMAT}
    md.update({k: str(cfg[k]) for k in INT_KEYS})
    md.update({k: repr(float(cfg[k])) for k in FLOAT_KEYS})
    md["decay"] = "dim>=2"
    md["gelu"] = "tanh"
    md["ln_eps"] = repr(float(cfg["ln_eps"]))
    md["seed"] = str(cfg["seed"])
    md["init_perturb"] = repr(float(cfg["init_perturb"]))
    md["tied_lm_head"] = "true"
    md["loss"] = "mean cross-entropy over B*T"
    md["reference_precision"] = "float64"
    md["generator"] = generator_string()
    return md


def fixture_tensors(cfg, params, inputs, targets, res):
    names = [n for n, _ in param_shapes(cfg)]
    f32 = lambda t: t.detach().to(torch.float32).numpy()
    out = [(n, "F32", f32(params[n])) for n in names]
    out.append(("fixture.inputs", "I32", inputs.to(torch.int32).numpy()))
    out.append(("fixture.targets", "I32", targets.to(torch.int32).numpy()))
    out.append(("fixture.logits", "F32", f32(res["logits"])))
    out.append(("fixture.loss", "F32", f32(res["loss"])))
    out += [(f"fixture.grad.{n}", "F32", f32(res["grads"][n])) for n in names]
    out.append(("fixture.losses", "F32", f32(res["losses"])))
    out += [(f"fixture.final.{n}", "F32", f32(res["final"][n])) for n in names]
    return out


def config_from_args(args):
    cfg = {
        "vocab_size": args.vocab, "n_embd": args.n_embd, "n_head": args.n_head, "n_layer": args.n_layer,
        "block_size": args.block_size, "B": args.B, "T": args.T, "steps": args.steps,
        "lr": args.lr, "beta1": args.beta1, "beta2": args.beta2, "eps": args.eps,
        "weight_decay": args.weight_decay, "ln_eps": args.ln_eps, "seed": args.seed,
        "init_perturb": args.init_perturb,
    }
    if cfg["n_embd"] % cfg["n_head"] != 0:
        sys.exit("error: n_embd must be divisible by n_head")
    if not 1 <= cfg["T"] <= cfg["block_size"]:
        sys.exit("error: need 1 <= T <= block_size")
    if cfg["steps"] < 1:
        sys.exit("error: steps must be >= 1")
    return cfg


def generate(args):
    cfg = config_from_args(args)
    gen = torch.Generator().manual_seed(cfg["seed"])
    params = init_params(cfg, gen)
    # The stored (float32) weights are the starting point, so compute from those.
    params = {n: p.to(torch.float32).to(torch.float64) for n, p in params.items()}
    inputs = torch.randint(0, cfg["vocab_size"], (cfg["B"], cfg["T"]), generator=gen)
    targets = torch.randint(0, cfg["vocab_size"], (cfg["B"], cfg["T"]), generator=gen)
    res = run(params, cfg, inputs, targets)
    write_safetensors(args.out, fixture_tensors(cfg, params, inputs, targets, res), make_metadata(cfg))
    losses = ", ".join(f"{x:.6f}" for x in res["losses"].tolist())
    print(f"wrote {args.out}: loss {res['loss'].item():.6f}, losses [{losses}]")


# ---------------------------------------------------------------------------
# --check: recompute an existing fixture from its own inputs
# ---------------------------------------------------------------------------


def check(path):
    md, t = read_safetensors(path)
    if md.get("format") != FORMAT:
        sys.exit(f"error: {path}: format is {md.get('format')!r}, expected {FORMAT!r}")
    cfg = {k: int(md[k]) for k in INT_KEYS}
    cfg.update({k: float(md[k]) for k in FLOAT_KEYS})
    cfg["ln_eps"] = float(md["ln_eps"])
    names = [n for n, _ in param_shapes(cfg)]
    params = {n: torch.from_numpy(t[n]).to(torch.float64) for n in names}
    inputs = torch.from_numpy(t["fixture.inputs"]).long()
    targets = torch.from_numpy(t["fixture.targets"]).long()
    res = run(params, cfg, inputs, targets)

    def diff(ours, name):
        """(max |ours - stored|, max |stored|, fraction of bit-identical float32 values)."""
        ref = t[name].astype(np.float64)
        ours64 = ours.detach().numpy().reshape(ref.shape)
        exact = np.mean(ours64.astype(np.float32) == t[name])
        return float(np.max(np.abs(ours64 - ref))), float(np.max(np.abs(ref))), float(exact)

    print(f"{path}")
    print("  " + ", ".join(f"{k}={md[k]}" for k in INT_KEYS + FLOAT_KEYS + ["ln_eps"]))
    rows = []
    for label, ours, name in [
        ("logits", res["logits"], "fixture.logits"),
        ("loss", res["loss"], "fixture.loss"),
        ("losses", res["losses"], "fixture.losses"),
    ]:
        rows.append((label,) + diff(ours, name))
    grad_rows = [diff(res["grads"][n], f"fixture.grad.{n}") for n in names]
    final_rows = [diff(res["final"][n], f"fixture.final.{n}") for n in names]
    worst_grad_rel = max(d / m if m > 0 else d for d, m, _ in grad_rows)
    worst_grad_abs = max(d for d, _, _ in grad_rows)
    final_abs = max(d for d, _, _ in final_rows)
    final_rel = max(d / m for d, m, _ in final_rows)

    print(f"  {'quantity':<8} {'max|ours-ref|':>14} {'rel. to max|ref|':>17} {'f32 bit-identical':>18}")
    for label, d, m, exact in rows:
        print(f"  {label:<8} {d:14.3e} {d / m:17.3e} {exact:17.1%}")
    def exact_fraction(prefix, rows_):
        sizes = [t[prefix + n].size for n in names]
        return sum(e * sz for (_, _, e), sz in zip(rows_, sizes)) / sum(sizes)

    exact_g = exact_fraction("fixture.grad.", grad_rows)
    exact_f = exact_fraction("fixture.final.", final_rows)
    print(f"  {'grads':<8} {worst_grad_abs:14.3e} {worst_grad_rel:17.3e} {exact_g:17.1%}   (worst tensor, rel. to that tensor's max)")
    print(f"  {'final':<8} {final_abs:14.3e} {final_rel:17.3e} {exact_f:17.1%}")
    worst_rel = max([d / m for _, d, m, _ in rows] + [worst_grad_rel, final_rel])
    # Independent float64 computations rounded to float32 differ by at most ~1 ulp (6e-8 rel.).
    ok = worst_rel < 1e-6
    print(f"  => {'OK' if ok else 'MISMATCH'} (worst relative difference {worst_rel:.2e})")
    return ok


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=101, help="vocabulary size V")
    ap.add_argument("--n-embd", type=int, default=64, help="embedding width C")
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=32, help="rows of wpe (max sequence length)")
    ap.add_argument("--B", type=int, default=2, help="batch size")
    ap.add_argument("--T", type=int, default=16, help="sequence length, <= block size")
    ap.add_argument("--steps", type=int, default=10, help="number of AdamW updates")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--ln-eps", type=float, default=1e-5, help="LayerNorm epsilon")
    ap.add_argument("--seed", type=int, default=1, help="seed of torch's CPU generator")
    ap.add_argument("--init-perturb", type=float, default=0.1,
                    help="half-width of the uniform noise added to biases and LN params")
    ap.add_argument("--out", help="fixture file to write")
    ap.add_argument("--check", metavar="FILE", nargs="+",
                    help="recompute existing fixture(s) from their own weights/inputs/targets and compare")
    args = ap.parse_args()

    if args.check:
        ok = all([check(path) for path in args.check])
        sys.exit(0 if ok else 1)
    if not args.out:
        ap.error("--out is required (or use --check FILE)")
    generate(args)


if __name__ == "__main__":
    main()
