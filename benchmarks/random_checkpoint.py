"""`graft models random SHAPE OUT`: a checkpoint with a real model's shape and random weights,
plus a small byte-level BPE chat tokenizer, for speed measurements: a weight's value does not
change how fast it is read or multiplied, so `graft bench engine` / `bench peers` on it measure
what they would on the real model (where memory bandwidth decides at 1.5B; an MoE LLM's
active-parameter roofline). Its outputs are noise: never use it for quality.

The tokenizer has a few hundred tokens (the model's vocab rows beyond them still exist and are
read by the head as in the real model); `convert_hf_to_gguf.py` pads the GGUF vocab to the
model's, so llama.cpp loads it too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# ChatML, as Qwen and SmolLM2 use it; `<image>` markers stay inside user text.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is shown in the image? A red circle on the left.",
    "Which digit is shown? The digit is 7.",
    "There are three blue squares and two green triangles.",
    "Describe the picture in one sentence.",
    "yes no zero one two three four five six seven eight nine",
    "Hello! How can I help you today? Please describe the scene.",
    "red green blue yellow purple orange circle square triangle star",
    "0 1 2 3 4 5 6 7 8 9 10 left right top bottom center",
]

# name -> (transformers model type, config fields): each a published model's config.json (the
# fields that decide shapes and speed), or the MoE checkpoint docs/benchmarks.md measures
SHAPES: dict[str, tuple[str, dict]] = {
    "qwen2.5-1.5b": ("qwen2", dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "smollm2-135m": ("llama", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "llama-3.2-1b": ("llama", dict(  # without its llama3 RoPE scaling (speed is the same)
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    # 229 M parameters, 44 M active per token: 32 experts of width 512, top-4
    "qwen3-moe-bench": ("qwen3_moe", dict(
        vocab_size=8192, hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=4, head_dim=64, intermediate_size=2048, moe_intermediate_size=512,
        num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, max_position_embeddings=2048,
        tie_word_embeddings=False)),
}
DTYPES = ("bfloat16", "float32")


def build_tokenizer(out_dir: str | Path, vocab_size: int = 384):
    """A byte-level BPE tokenizer with a ChatML template; eos = <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shape", choices=sorted(SHAPES), help="whose config the checkpoint copies")
    p.add_argument("out", type=Path, help="the checkpoint dir to write (must not exist, or be empty)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                   help="the saved weights' dtype (published checkpoints are bf16)")
    p.add_argument("--layers", type=int, default=None,
                   help="keep only this many decoder layers (each the real model's shape): a "
                        "smaller checkpoint with the same per-layer matmuls")
    p.add_argument("--seed", type=int, default=0)


def random_config(shape: str, layers: int | None = None):
    """The transformers config of SHAPES[shape] (num_hidden_layers = layers when given), with
    the tokenizer's special ids."""
    from transformers import AutoConfig

    from graft.errors import GraftConfigError

    if shape not in SHAPES:
        raise GraftConfigError(f"shape {shape!r}: use one of {', '.join(sorted(SHAPES))}")
    model_type, fields = SHAPES[shape]
    fields = dict(fields)
    if layers is not None:  # it keeps that many of the real model's layers: never adds any
        have = fields["num_hidden_layers"]
        if not 1 <= layers <= have:
            raise GraftConfigError(f"--layers {layers}: {shape} has {have} decoder layers; use "
                                   f"1 to {have} (or leave --layers out for all of them)")
        fields["num_hidden_layers"] = layers
    # ids of the tokenizer below: <|endoftext|> pads, <|im_end|> ends a turn
    return AutoConfig.for_model(model_type, **fields, pad_token_id=0, eos_token_id=2,
                                bos_token_id=None)


def write_random_checkpoint(shape: str, out: str | Path, dtype: str = "bfloat16",
                            layers: int | None = None, seed: int = 0) -> Path:
    """Write SHAPES[shape] with random weights (normal, std 0.02 as transformers initialises)
    and the tokenizer to `out`, through a temp dir renamed into place. Refuses a non-empty
    `out`: nothing a user made is overwritten."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from graft.errors import GraftConfigError
    from graft.io import atomic_write_dir

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GraftConfigError(f"{out} exists and is not an empty dir; pick another OUT or remove it")
    if dtype not in DTYPES:
        raise GraftConfigError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    config = random_config(shape, layers)

    def write(tmp: Path) -> None:
        tok = build_tokenizer(tmp)
        assert (tok.pad_token_id, tok.eos_token_id) == (config.pad_token_id, config.eos_token_id)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id,
                                                   pad_token_id=tok.pad_token_id)
        model.save_pretrained(str(tmp))

    return atomic_write_dir(out, write)


def run(args: argparse.Namespace) -> int:
    out = write_random_checkpoint(args.shape, args.out, args.dtype, args.layers, args.seed)
    print(f"{args.shape} with random weights ({args.dtype}): {out}")
    return 0
