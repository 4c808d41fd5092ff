"""Writes a Llama-architecture model with random weights as a Hugging Face
model folder (config.json, safetensors shards and their index), the way a
downloaded model sits on disk: what the 24 GB recipes start from where no
hub can be reached. Random weights: the outputs mean nothing; the speed and
the memory are a real model's.

    python examples/recipes/write_llama.py /data/llama-7b --shape 7b
    python examples/recipes/write_llama.py /tmp/tiny --shape tiny

One tensor at a time is made and written (shards of at most 2 GB), so the
host holds one shard, not the model. Needs torch and safetensors only."""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

# Llama-2-7B's shapes; a 3B of Llama-3.2-3B's (grouped-query attention) with
# Llama-2's vocabulary; and a tiny one for tests.
SHAPES = {
    "7b": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=11008,
               num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    "3b": dict(num_hidden_layers=28, hidden_size=3072, intermediate_size=8192,
               num_attention_heads=24, num_key_value_heads=8, vocab_size=32000),
    "tiny": dict(num_hidden_layers=2, hidden_size=256, intermediate_size=688,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
}
SHARD_BYTES = 2 * 10**9


def config(shape: str, dtype: str) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "torch_dtype": dtype, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "hidden_act": "silu", "initializer_range": 0.02,
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
            "bos_token_id": 1, "eos_token_id": 2, **SHAPES[shape]}


def tensors(c: dict):
    """(name, shape) of every weight, in Hugging Face's names and order."""
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    yield "model.embed_tokens.weight", (v, h)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (h, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, h)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (i, h)
        yield p + "mlp.up_proj.weight", (i, h)
        yield p + "mlp.down_proj.weight", (h, i)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def write(out: str, shape: str = "7b", dtype: str = "bfloat16", seed: int = 0) -> dict:
    """Writes the model folder; returns its config."""
    os.makedirs(out, exist_ok=True)
    c = config(shape, dtype)
    torch_dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(seed)
    shards, current, size = [], {}, 0

    def flush():
        nonlocal current, size
        if current:
            shards.append(current)
            save_file(current, os.path.join(out, f"part-{len(shards):05d}.safetensors"),
                      metadata={"format": "pt"})
            current, size = {}, 0
    for name, dims in tensors(c):
        if len(dims) == 1:                        # a norm's weight: ones, as initialized
            t = torch.ones(dims, dtype=torch_dtype)
        else:
            t = torch.empty(dims, dtype=torch.float32).normal_(0, c["initializer_range"],
                                                               generator=g).to(torch_dtype)
        if size + t.nbytes > SHARD_BYTES:
            flush()
        current[name] = t
        size += t.nbytes
    flush()
    total = len(shards)
    weight_map, nbytes = {}, 0
    for k, shard in enumerate(shards, 1):
        final = f"model-{k:05d}-of-{total:05d}.safetensors"
        os.replace(os.path.join(out, f"part-{k:05d}.safetensors"), os.path.join(out, final))
        for name, t in shard.items():
            weight_map[name] = final
            nbytes += t.nbytes
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": nbytes}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write(args.out, args.shape, args.dtype, args.seed)
    print(f"{args.out}: a {args.shape} Llama with random {args.dtype} weights")


if __name__ == "__main__":
    main()
