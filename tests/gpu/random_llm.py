"""Write a randomly initialised LLM with a real model's shapes, for engine benchmarks on a
machine that holds no weights (the GPU check): throughput does not depend on the values.

python -m tests.gpu.random_llm OUT_DIR [--shape smollm2-135m|llama-1b] [--dtype bfloat16]
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {  # numbers from the models' published config.json files
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                         max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                     max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=True),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out_dir")
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[args.shape], rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                      pad_token_id=2)
    LlamaForCausalLM(cfg).to(getattr(torch, args.dtype)).save_pretrained(args.out_dir)
    print(f"wrote a random {args.shape} to {args.out_dir}")


if __name__ == "__main__":
    main()
