"""Write a random-weight Qwen3-MoE (425M parameters, 1.6 GB in fp32; values do not change
speed or memory), a small uneven-answer data set and a graft.yaml over them: the case that
`graft bench sharding` measures in docs/training.md.

python -m tests.graft.train.make_moe_graft OUT_DIR
"""

import sys
from pathlib import Path

import torch

from graft.spec import GraftSpec
from tests.graft.train.launch import uneven_dataset
from tests.tiny_llm import build_tokenizer

SHAPE = dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
             moe_intermediate_size=512, decoder_sparse_step=1, norm_topk_prob=True,
             max_position_embeddings=512, tie_word_embeddings=False)
TINY_VIT = {"kind": "timm", "model_name": "vit_tiny_patch16_224", "timm_kwargs": {
    "img_size": 32, "patch_size": 16, "embed_dim": 32, "depth": 2, "num_heads": 2}}


def main(out: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = build_tokenizer(out / "llm")
    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                               eos_token_id=tok.eos_token_id, **SHAPE)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(out / "llm"))
    data = uneven_dataset(out / "data")
    GraftSpec.from_dict({
        "encoder": TINY_VIT, "adapter": {"kind": "mlp", "depth": 2}, "llm": {"path": str(out / "llm")},
        "data": {"train": str(data), "image_root": str(data.parent), "max_length": 256},
        "train": {"lr": 1e-3, "batch_size": 2, "warmup_ratio": 0.0}, "output_dir": str(out / "run"),
    }).save(out / "graft.yaml")
    print(f"wrote {out / 'graft.yaml'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
