"""A llama.cpp GGUF file served as it is (graft.gguf_llm, serving.models.gguf_weights): its
Q4_0/Q4_1 linears held in int4-g32 and its Q8_0 head and table in int8-g32, exactly as
transformers dequantizes them, greedy tokens
equal to HF transformers running the same file, and `graft serve FILE.gguf` /
`graft models gguf FILE.gguf` from the command line."""

import argparse

import httpx
import pytest
import torch

from graft.errors import GraftConfigError
from graft.gguf_llm import GGUF_INFO, gguf_llm_dir
from graft.serving import Engine, EngineConfig, SamplingParams
from tests.gguf_files import write_gguf
from tests.tiny_llm import build_llm

pytest.importorskip("gguf")

# attention in Q4_0, the MLP in Q4_1, the embedding (and a separate head) in Q8_0, as
# llama.cpp's mixed files hold them
TYPES = {"q_proj": "Q4_0", "k_proj": "Q4_0", "v_proj": "Q4_0", "o_proj": "Q4_1",
         "gate_proj": "Q4_1", "up_proj": "Q4_1", "down_proj": "Q4_0", "lm_head": "Q8_0"}
PROMPTS = ["hello there", "What is the capital of France?", "Count: one, two,"]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def gguf_file(request, tmp_path_factory, monkeypatch_module):
    root = tmp_path_factory.mktemp(f"gguf_{request.param}")
    monkeypatch_module.setenv("GRAFT_GGUF_CACHE", str(root / "cache"))
    # transformers reads no head size from a Qwen3 GGUF: Qwen3's own 128 (every Qwen3 has it)
    llm = build_llm(root / "hf", request.param,
                    config_overrides={"head_dim": 128} if request.param == "qwen3" else None)
    return write_gguf(llm, root / f"tiny-{request.param}.Q4.gguf", TYPES, other="Q8_0")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _hf(llm_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llm_dir, gguf_file="model.gguf",
                                                dtype=torch.float32).eval()


def test_q4_linears_are_held_exactly_as_hf_reads_them(gguf_file, caplog):
    llm_dir = gguf_llm_dir(gguf_file)
    with caplog.at_level("WARNING", logger="graft.serving"):
        engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=32))
    model, plan = engine.runner.model, engine.runner.quant_plan
    table = ("lm_head", "embed_tokens")
    assert {n: s.name for n, s in plan.items() if n not in table} == {
        n: "int4-g32" for n in plan if n not in table}
    assert plan["lm_head"].name == plan["embed_tokens"].name == "int8-g32"  # Q8_0's own grid
    assert "held in fp32" not in caplog.text  # nothing widened
    hf_lm = _hf(llm_dir)
    assert torch.equal(model.linear_weight("lm_head").dequantize(), hf_lm.lm_head.weight.detach())
    assert torch.equal(model.embed_quantized.dequantize(), hf_lm.model.embed_tokens.weight.detach())
    hf = hf_lm.model
    for i, layer in enumerate(hf.layers):
        attn, mlp = layer.self_attn, layer.mlp
        want = {"self_attn.qkv_proj": torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                                 attn.v_proj.weight]),
                "self_attn.o_proj": attn.o_proj.weight,
                "mlp.gate_up_proj": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                "mlp.down_proj": mlp.down_proj.weight}
        for name, weight in want.items():
            got = model.linear_weight(f"layers.{i}.{name}").dequantize()
            assert torch.equal(got, weight.detach()), f"layers.{i}.{name}"


def test_a_bf16_engine_keeps_the_files_grids_too(gguf_file):
    """bf16 activations: the Q4 and Q8_0 weights from the blocks all the same."""
    llm_dir = gguf_llm_dir(gguf_file)
    engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=32, dtype="bfloat16"))
    model = engine.runner.model
    assert engine.runner.quant_plan["lm_head"].name == "int8-g32"
    hf = _hf(llm_dir).model
    got = model.linear_weight("layers.1.mlp.down_proj").dequantize()
    assert torch.equal(got, hf.layers[1].mlp.down_proj.weight.detach())
    out = engine.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def test_greedy_tokens_equal_hf_on_the_same_file(gguf_file):
    llm_dir = gguf_llm_dir(gguf_file)
    engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=32))
    hf = _hf(llm_dir)
    chats = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                                  add_generation_prompt=True,
                                                  return_dict=True)["input_ids"] for p in PROMPTS]
    got = engine.generate(chats, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    for ids, out in zip(chats, got):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=10, min_new_tokens=10,
                              do_sample=False)
        assert out.token_ids == ref[0, len(ids):].tolist()


def test_a_quantization_flag_wins_over_the_files(gguf_file):
    engine = Engine.from_pretrained(gguf_llm_dir(gguf_file),
                                    EngineConfig(num_kv_blocks=32, quantization="int8"))
    assert {s.name for s in engine.runner.quant_plan.values()} == {"int8"}


def test_the_commands_take_the_file(gguf_file, capsys):
    from graft.cli import main
    from graft.serving.http import serve_cli
    from tests.serving.http.conftest import LiveServer

    assert main(["models", "gguf", str(gguf_file)]) == 0
    llm_dir = capsys.readouterr().out.strip()
    assert llm_dir == str(gguf_llm_dir(gguf_file))
    made = (gguf_llm_dir(gguf_file) / GGUF_INFO).stat().st_mtime_ns
    assert main(["models", "gguf", str(gguf_file)]) == 0  # made once: read again, not rewritten
    assert (gguf_llm_dir(gguf_file) / GGUF_INFO).stat().st_mtime_ns == made

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    with LiveServer(serve_cli.build(parser.parse_args([str(gguf_file), "--num-kv-blocks", "32"]))) as server:
        assert [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]] == [gguf_file.name]
        reply = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": gguf_file.name, "max_tokens": 4,
            "messages": [{"role": "user", "content": "hello"}]})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1


def test_a_file_transformers_cannot_read_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFT_GGUF_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(GraftConfigError, match="broken.gguf: graft cannot read this GGUF"):
        gguf_llm_dir(bad)
    assert not any((tmp_path / "cache").glob("broken-*"))  # nothing half-made stays


def test_eval_backends_take_the_file(gguf_file):
    """`graft eval --model FILE.gguf`: the engine (the file's int4) and HF (the file
    dequantized) answer alike."""
    from graft.evals.backends import make_backend
    from graft.evals.backends.base import Request

    asks = [Request([{"role": "user", "content": p}], max_new_tokens=6) for p in PROMPTS]
    engine = make_backend(str(gguf_file), "engine")
    hf = make_backend(str(gguf_file), "hf")
    # random tiny weights pick stray byte tokens: HF writes an unfinished UTF-8 sequence
    # as U+FFFD, the engine holds it back
    def texts(backend):
        return [r.prediction.replace("\ufffd", "") for r in backend.generate(asks)]

    assert texts(engine) == texts(hf)
