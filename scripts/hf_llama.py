#!/usr/bin/env python3
"""A small Hugging Face LLaMA model directory, as transformers would save one.

DIR/model.safetensors (float32 weights by LlamaForCausalLM's names:
model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...,
lm_head.weight), DIR/config.json (the LlamaConfig fields transformers writes)
and DIR/tokenizer.json (a copy of --tokenizer; the vocabulary is its size).
build/train --init-from DIR fine-tunes it, build/sample DIR samples from it.

Two ways to make the weights:

  fresh, by the PyTorch reference (tests/ref/llama_ref.py's initialisation:
  normal(0, 0.02), o_proj and down_proj 0.02/sqrt(2 layers), norms 1; needs
  Debian's python3-torch, run with /usr/bin/python3):

    /usr/bin/python3 scripts/hf_llama.py --out llama-small --tokenizer tok.json \\
        --layers 4 --heads 4 --kv-heads 2 --embd 128 --ffn 352 --context 256

  from a ptrain LLaMA file, a checkpoint (build/train --checkpoint) or a
  fixture (tests/fixtures/llama/*.safetensors), which already name their
  weights as Hugging Face does; its metadata gives config.json. The Python
  standard library is enough:

    python3 scripts/hf_llama.py --out DIR --from ckpt.safetensors [--tokenizer tok.json]
"""

import argparse
import json
import os
import shutil
import struct
import sys


def read_safetensors(path):
    """(metadata, {name: (dtype, shape, bytes)}) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    return meta, {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
                  for k, v in header.items()}


def write_safetensors(path, tensors):
    """tensors: [(name, shape, float32 little-endian bytes)] in order."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, raw in tensors:
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data 8-byte aligned, as the Rust writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, raw in tensors:
            f.write(raw)


def tokenizer_vocab(path):
    """The ids a tokenizer.json uses: its largest id + 1, and <|endoftext|>'s id."""
    with open(path, encoding="utf-8") as f:
        tk = json.load(f)
    ids = dict(tk["model"]["vocab"])
    ids.update({t["content"]: t["id"] for t in tk.get("added_tokens", [])})
    return max(ids.values()) + 1, ids.get("<|endoftext|>", 0)


def config_json(cfg, eot):
    """config.json as transformers' LlamaConfig.save_pretrained writes it."""
    c = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": bool(cfg["bias"]),
        "attention_dropout": 0.0,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "head_dim": cfg["n_embd"] // cfg["n_head"],
        "hidden_act": "silu",
        "hidden_size": cfg["n_embd"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["ffn_hidden"],
        "max_position_embeddings": cfg["block_size"],
        "mlp_bias": bool(cfg["bias"]),
        "model_type": "llama",
        "num_attention_heads": cfg["n_head"],
        "num_hidden_layers": cfg["n_layer"],
        "num_key_value_heads": cfg["n_kv_head"],
        "pretraining_tp": 1,
        "rms_norm_eps": cfg["norm_eps"],
        "rope_scaling": None,
        "rope_theta": cfg["rope_theta"],
        "tie_word_embeddings": bool(cfg["tie"]),
        "torch_dtype": "float32",
        "transformers_version": "4.46.0",
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }
    if cfg.get("rope_scaling_factor", 0.0) > 0:
        c["rope_scaling"] = {"factor": cfg["rope_scaling_factor"],
                             "low_freq_factor": cfg["rope_low_freq_factor"],
                             "high_freq_factor": cfg["rope_high_freq_factor"],
                             "original_max_position_embeddings": cfg["rope_original_max_pos"],
                             "rope_type": "llama3"}
    return json.dumps(c, indent=2, sort_keys=True) + "\n"


def from_ptrain(path):
    """config and tensors of a ptrain LLaMA checkpoint or fixture."""
    meta, t = read_safetensors(path)
    if meta.get("arch") != "llama":
        sys.exit(f"error: {path}: arch is {meta.get('arch')!r}, not a ptrain LLaMA file "
                 "(a checkpoint of --preset llama-*, or tests/fixtures/llama/)")
    if meta.get("norm", "rmsnorm") != "rmsnorm" or meta.get("mlp", "swiglu") != "swiglu" or \
            meta.get("rope", "rotate_half") != "rotate_half":
        sys.exit(f"error: {path}: not what LlamaForCausalLM computes (norm {meta.get('norm')}, "
                 f"mlp {meta.get('mlp')}, rope {meta.get('rope')})")
    cfg = {k: int(meta[k]) for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")}
    cfg["n_kv_head"] = int(meta.get("n_kv_head", cfg["n_head"]))
    cfg["ffn_hidden"] = int(meta.get("ffn_hidden", 4 * cfg["n_embd"]))
    cfg["norm_eps"] = float(meta.get("norm_eps", meta.get("ln_eps", "1e-5")))
    cfg["rope_theta"] = float(meta.get("rope_theta", "10000"))
    cfg["tie"] = int(meta.get("tie_embeddings", "0"))
    cfg["bias"] = int(meta.get("bias", "0"))
    for k in ("rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
        cfg[k] = float(meta.get(k, "0"))
    cfg["rope_original_max_pos"] = int(meta.get("rope_original_max_pos", "0"))
    tensors = []
    for name, (dtype, shape, raw) in t.items():  # the model's, in the file's order
        if not (name.startswith("model.") or name == "lm_head.weight"):
            continue  # AdamW state (optim.*), a fixture's inputs and gradients (fixture.*)
        if dtype != "F32":
            sys.exit(f"error: {path}: {name} is {dtype}, expected F32")
        tensors.append((name, shape, raw))
    return cfg, tensors


def from_reference(args, vocab):
    """config and tensors freshly initialised by tests/ref/llama_ref.py."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "ref"))
    try:
        import torch  # noqa: F401
        import llama_ref
    except ImportError as e:
        sys.exit(f"error: the PyTorch reference needs Debian's python3-torch and python3-numpy "
                 f"({e}); run with /usr/bin/python3, or convert a ptrain file with --from")
    cfg = {"vocab_size": vocab, "n_embd": args.embd, "n_head": args.heads, "n_kv_head": args.kv_heads,
           "ffn_hidden": args.ffn, "n_layer": args.layers, "block_size": args.context,
           "norm_eps": args.norm_eps, "rope_theta": args.rope_theta, "tie": 0, "bias": 0,
           "init_perturb": 0.0}
    if args.embd % args.heads or args.heads % args.kv_heads or (args.embd // args.heads) % 2:
        sys.exit("error: need --heads dividing --embd, --kv-heads dividing --heads, an even head size")
    gen = torch.Generator().manual_seed(args.seed)
    params = llama_ref.init_params(cfg, gen)
    tensors = [(name, shape, params[name].to(torch.float32).numpy().astype("<f4").tobytes())
               for name, shape in llama_ref.param_shapes(cfg)]
    return cfg, tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the directory to write (made if missing)")
    ap.add_argument("--tokenizer", help="a tokenizer.json (build/bpe_train's): copied, and its size "
                    "is the vocabulary of a fresh model")
    ap.add_argument("--from", dest="src", help="a ptrain LLaMA checkpoint or fixture to convert")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=176, help="SwiGLU hidden size")
    ap.add_argument("--context", type=int, default=256, help="max_position_embeddings")
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    vocab, eot = tokenizer_vocab(args.tokenizer) if args.tokenizer else (0, 0)
    if args.src:
        cfg, tensors = from_ptrain(args.src)
        if vocab > cfg["vocab_size"]:
            sys.exit(f"error: the tokenizer {args.tokenizer} has {vocab} ids, the model's "
                     f"vocabulary {cfg['vocab_size']}")
    elif not args.tokenizer:
        sys.exit("error: give --tokenizer (its size is the vocabulary), or --from a ptrain file")
    else:
        cfg, tensors = from_reference(args, vocab)
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        f.write(config_json(cfg, eot))
    if args.tokenizer:
        shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    n = sum(len(raw) // 4 for _, _, raw in tensors)
    print(f"{args.out}: LlamaForCausalLM, {cfg['n_layer']} layers, {cfg['n_head']} heads "
          f"({cfg['n_kv_head']} key/value), {cfg['n_embd']} wide, vocabulary {cfg['vocab_size']}, "
          f"{n / 1e6:.2f}M parameters{', tokenizer.json' if args.tokenizer else ''}")


if __name__ == "__main__":
    main()
