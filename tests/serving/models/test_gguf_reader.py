"""graft's own GGUF read (graft.gguf_file, serving.models.gguf_weights): the header walk equals
gguf-py's reader, the tensors streamed one at a time equal what transformers'
load_gguf_checkpoint returns for the whole file, and a linear the plan holds in int4-g32
whose blocks are Q4_0/Q4_1 is read straight from them: its dense weight never made, its
values HF's."""

import pytest
import torch

from graft.gguf_file import GGUFFile, hf_names
from graft.kernels import cpu_ops
from graft.gguf_llm import gguf_llm_dir, gguf_tensor_names
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.models.gguf_weights import GGUFTensors
from tests.gguf_files import write_gguf
from tests.serving.conftest import fused_then_per_op, three_decodes
from tests.tiny_llm import build_llm

gguf = pytest.importorskip("gguf")

TYPES = {"q_proj": "Q4_0", "k_proj": "Q4_0", "v_proj": "Q4_0", "o_proj": "Q4_1",
         "gate_proj": "Q4_1", "up_proj": "Q4_1", "down_proj": "Q4_0", "lm_head": "Q8_0"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("gguf_reader")
        mp.setenv("GRAFT_GGUF_CACHE", str(root / "cache"))
        yield root


WIDE = {"hidden_size": 256, "intermediate_size": 512}  # Q4_K's rows: multiples of 256


def _file(root, family: str, types=TYPES, other="Q8_0", overrides=None):
    wide = "-wide" if overrides else ""
    name = f"{family}{wide}-{'-'.join(types[k] for k in sorted(types))}-{other}.gguf"
    if not (root / name).is_file():
        llm = build_llm(root / f"hf-{family}{wide}", family, config_overrides=overrides)
        write_gguf(llm, root / name, types, other=other)
    return root / name


def _hf(llm_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llm_dir, gguf_file="model.gguf",
                                                dtype=torch.float32).eval()


def test_the_header_walk_equals_gguf_py(cache):
    path = _file(cache, "qwen2")
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    assert ours.architecture == "qwen2"
    assert ours.metadata["qwen2.block_count"] == theirs.fields["qwen2.block_count"].parts[-1][0]
    assert ours.metadata["tokenizer.ggml.tokens"] == len(theirs.fields["tokenizer.ggml.tokens"].data)
    assert ours.metadata["tokenizer.chat_template"].startswith("{%")
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        kind, shape, _ = ours.tensors[t.name]
        assert kind == t.tensor_type.name and shape == tuple(reversed(t.shape.tolist()))
        assert (ours.raw(t.name) == t.data).all(), t.name


MIXED = {"q_proj": "F16", "k_proj": "BF16", "v_proj": "Q4_0", "o_proj": "Q5_0",
         "gate_proj": "Q8_0", "up_proj": "Q4_1", "down_proj": "F32"}


MOE = dict(TYPES, ffn_gate_exps="Q4_0", ffn_up_exps="Q4_1", ffn_down_exps="Q4_K")
MOE_WIDE = {"hidden_size": 256, "moe_intermediate_size": 256}  # Q4_K's down_proj rows


@pytest.mark.parametrize("family,types,other,overrides", [
    ("llama", TYPES, "Q8_0", None), ("qwen2", TYPES, "Q8_0", None), ("llama", MIXED, "BF16", None),
    ("qwen3_moe", MOE, "Q8_0", MOE_WIDE)])  # its experts stacked: gate and up side by side
def test_the_stream_equals_transformers_reading(cache, family, types, other, overrides):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    llm_dir = gguf_llm_dir(_file(cache, family, types, other, overrides))
    config = AutoConfig.from_pretrained(llm_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    want = load_gguf_checkpoint(str(llm_dir / "model.gguf"), return_tensors=True,
                                model_to_load=model)["tensors"]
    names = gguf_tensor_names(llm_dir)  # transformers' map, kept in the dir: made now, equal
    built: dict[str, list[str]] = {}
    for gguf_name, hf in hf_names(GGUFFile(llm_dir / "model.gguf"), model)[0].items():
        built.setdefault(hf, []).append(gguf_name)
    assert names == built
    stream = GGUFTensors(llm_dir / "model.gguf", config, names)
    assert sorted(stream.keys()) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(stream.get_tensor(name), tensor), name


def test_a_dir_without_tensor_names_is_refused_in_one_line(cache, tmp_path):
    import json
    import shutil

    from graft.errors import GraftConfigError

    made = gguf_llm_dir(_file(cache, "qwen2"))
    copy = tmp_path / "dir"
    shutil.copytree(made, copy, symlinks=True)
    info = json.loads((copy / "gguf.json").read_text())
    del info["tensors"]
    (copy / "gguf.json").write_text(json.dumps(info))
    with pytest.raises(GraftConfigError, match="gguf.json names no GGUF tensors"):
        Engine.from_pretrained(copy, EngineConfig(num_kv_blocks=16))


PARTS = {"self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
         "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"]}


def _held_as_hf(engine, hf, modules=("self_attn.o_proj", "mlp.down_proj")):
    model = engine.runner.model
    for i, layer in enumerate(hf.model.layers):
        for name in modules:
            got = model.linear_weight(f"layers.{i}.{name}")
            assert got is not None and model.get_submodule(f"layers.{i}.{name}").weight.is_meta
            want = torch.cat([layer.get_submodule(p).weight for p in PARTS.get(name, [name])])
            assert torch.equal(got.dequantize(), want), f"{i}.{name}"


@pytest.mark.parametrize("scheme", ["int4-g32", "int4-g32-a8"])
def test_a_planned_int4_g32_is_read_from_the_blocks(cache, scheme):
    """Asked for by name too (not only the file's default): the file's grid, exactly."""
    llm_dir = gguf_llm_dir(_file(cache, "qwen2"))
    engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16, quantization=scheme))
    _held_as_hf(engine, _hf(llm_dir), ("self_attn.qkv_proj", "self_attn.o_proj",
                                       "mlp.gate_up_proj", "mlp.down_proj"))


def test_a_packed_linear_with_a_part_in_other_blocks_is_quantized_after_loading(cache):
    types = dict(TYPES, k_proj="Q8_0")  # q|k|v: Q4_0, Q8_0, Q4_0
    llm_dir = gguf_llm_dir(_file(cache, "qwen2", types))
    engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16, quantization="int4-g32"))
    hf = _hf(llm_dir)
    _held_as_hf(engine, hf)
    qkv = engine.runner.model.linear_weight("layers.0.self_attn.qkv_proj")
    attn = hf.model.layers[0].self_attn
    dense = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert qkv.scheme.name == "int4-g32" and qkv.shape == tuple(dense.shape)
    default = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16))
    assert default.runner.quant_plan["layers.0.self_attn.qkv_proj"].name == "fp32"


@pytest.mark.parametrize("family,other", [("llama", "Q4_0"), ("qwen2", "Q4_1")])
def test_a_q4_embedding_is_held_as_its_blocks(cache, family, other):
    """The table in the file's int4, as llama.cpp keeps it (no dense copy made); a tied
    head (llama: no output tensor) shares its blocks. Lookups and greedy tokens are HF's."""
    llm_dir = gguf_llm_dir(_file(cache, family, other=other))
    engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16))
    hf = _hf(llm_dir)
    model, plan = engine.runner.model, engine.runner.quant_plan
    if family == "llama" and cpu_ops.available():  # before dequantize() brings a copy back
        _the_tied_heads_layout_serves_the_lookups(engine, kind=7)
    assert plan["embed_tokens"].name == "int4-g32" and model.embed_tokens.weight.is_meta
    table = hf.model.embed_tokens.weight
    if family == "llama":
        assert plan["lm_head"].name == "int4-g32"
        assert torch.equal(model.head_quantized.dequantize(), table)
    assert torch.equal(model.embed_quantized.dequantize(), table)
    ids = [5, 6, 7, 8]
    got = engine.generate([ids], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert got[0].token_ids == ref[0, len(ids):].tolist()


def _the_tied_heads_layout_serves_the_lookups(engine, kind):
    """The table and a tied head in the same blocks are one QuantizedWeight: once packed, its C
    layout is the only copy, and the one-call decode step looks rows up in it (embed_kind:
    6 int8, 7 int4) as the per-op path does."""
    model = engine.runner.model
    assert model.embed_quantized is model.head_quantized and not model.head_quantized.tensors()
    assert model.fused_decode.step_desc.embed_kind == kind
    fused, per_op, _, _ = fused_then_per_op(engine, three_decodes(engine, SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True)))
    assert torch.equal(fused, per_op)


def test_q4_k_blocks_lose_only_fp16_rounding_of_their_scales():
    """Any Q4_K bytes: graft's int4 form equals gguf-py's (transformers') dequantization where
    d*sc and dmin*m are fp16 numbers, and is within their fp16 rounding elsewhere."""
    import numpy as np
    from gguf.quants import dequantize

    from graft.gguf_file import _q4_k
    from graft.kernels.quant_formats import QuantizedWeight, QuantScheme

    rng = np.random.default_rng(0)
    for d, dmin, exact in ((2.0 ** -9, 2.0 ** -7, True), (0.0031, 0.0057, False)):
        blocks = rng.integers(0, 256, size=(6, 2, 144), dtype=np.uint8)
        blocks[..., 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        blocks[..., 2:4] = np.frombuffer(np.float16(dmin).tobytes(), np.uint8)
        want = torch.from_numpy(dequantize(blocks.reshape(6, -1), gguf.GGMLQuantizationType.Q4_K))
        packed, scale, low = (t.reshape(6, -1) for t in _q4_k(torch.from_numpy(blocks), "Q4_K"))
        got = QuantizedWeight(QuantScheme.parse("int4-g32"), packed, scale, low).dequantize()
        if exact:
            assert torch.equal(got, want)
        else:  # |error| <= 15 * ulp/2 of the scale + ulp/2 of the min (fp16: 2^-11 relative)
            bound = (15 * 63 * d + 63 * dmin) * 2.0 ** -11
            assert 0 < (got - want).abs().max() <= bound


def test_a_q4_k_m_file_is_served_in_its_own_blocks(cache, caplog):
    """llama.cpp's most used files are Q4_K_M: Q4_K linears held in int4-g32 (scales to fp16),
    Q6_K ones (ffn_down, output) in int8-g16 exactly, the table in int4-g32, not widened to
    fp32; only a packed q|k|v of Q4_K and Q6_K parts is (said in a warning). Greedy tokens are
    HF's own on the weights the engine holds."""
    types = dict.fromkeys(TYPES, "Q4_K") | {"v_proj": "Q6_K", "down_proj": "Q6_K", "lm_head": "Q6_K"}
    llm_dir = gguf_llm_dir(_file(cache, "qwen2", types, other="Q4_K", overrides=WIDE))
    with caplog.at_level("INFO", logger="graft.serving"):
        engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16))
    plan = {name.split(".", 2)[-1]: s.name for name, s in engine.runner.quant_plan.items()}
    assert plan == {"self_attn.qkv_proj": "fp32", "self_attn.o_proj": "int4-g32",
                    "mlp.gate_up_proj": "int4-g32", "mlp.down_proj": "int8-g16",
                    "lm_head": "int8-g16", "embed_tokens": "int4-g32"}
    assert ("3 Q6_K weights in int8-g16 exactly, 6 Q4_K weights in int4-g32 with their scales "
            "rounded to fp16, the rest fp32; the embedding table in int4-g32") in caplog.text
    assert "2 linears stored in Q4_K/Q6_K are held in fp32" in caplog.text
    hf = _hf(llm_dir)
    model = engine.runner.model
    assert torch.equal(model.linear_weight("lm_head").dequantize(), hf.lm_head.weight)
    assert (model.embed_quantized.dequantize() - hf.model.embed_tokens.weight).abs().max() < 1e-3
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(model.embed_quantized.dequantize())
    for i, layer in enumerate(hf.model.layers):
        assert torch.equal(model.linear_weight(f"layers.{i}.mlp.down_proj").dequantize(), layer.mlp.down_proj.weight)
        assert model.get_submodule(f"layers.{i}.mlp.down_proj").weight.is_meta  # never widened
        for name in ("self_attn.o_proj", "mlp.gate_up_proj"):
            held = model.linear_weight(f"layers.{i}.{name}").dequantize()
            parts = [layer.get_submodule(p) for p in PARTS.get(name, [name])]
            assert (held - torch.cat([p.weight for p in parts])).abs().max() < 1e-3
            with torch.no_grad():  # HF on the engine's weights: the reference for the tokens
                for p, w in zip(parts, held.split([p.out_features for p in parts])):
                    p.weight.copy_(w)
    ids = [5, 6, 7, 8]
    got = engine.generate([ids], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert got[0].token_ids == ref[0, len(ids):].tolist()
    caplog.clear()
    with caplog.at_level("WARNING", logger="graft.serving"):  # bf16: the rest rounded, and said so
        bf16 = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16, dtype="bfloat16"))
    assert "2 linears stored in Q4_K/Q6_K are held in bf16 (rounded to bf16, more bytes" in caplog.text
    assert bf16.runner.quant_plan["layers.0.mlp.down_proj"].name == "int8-g16"


@pytest.mark.parametrize("family,quantization", [("llama", None), ("qwen2", None), ("qwen2", "int8-g16")])
def test_a_q8_0_file_is_held_in_int8_g32_exactly(cache, family, quantization):
    """Every Q8_0 tensor (the linears, the head, the table; llama's head tied to it) held in
    int8-g32 straight from the blocks, HF's values bit for bit (int8-g16 asked for: each scale
    twice, the same values); greedy tokens HF's on the file."""
    types = dict.fromkeys(TYPES, "Q8_0")
    llm_dir = gguf_llm_dir(_file(cache, family, types, other="Q8_0"))
    engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16, quantization=quantization))
    hf = _hf(llm_dir)
    scheme = quantization or "int8-g32"
    model, plan = engine.runner.model, engine.runner.quant_plan
    if quantization is None and family == "llama" and cpu_ops.available():  # tied: one copy
        _the_tied_heads_layout_serves_the_lookups(engine, kind=6)
    assert {s.name for s in plan.values()} == {scheme} and set(plan) >= {"lm_head"}
    _held_as_hf(engine, hf, ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"))
    assert torch.equal(model.linear_weight("lm_head").dequantize(), hf.lm_head.weight)
    if quantization is None:  # a named scheme holds no table unless the config names it
        assert plan["embed_tokens"].name == scheme and model.embed_tokens.weight.is_meta
        assert torch.equal(model.embed_quantized.dequantize(), hf.model.embed_tokens.weight)
    ids = [5, 6, 7, 8]
    got = engine.generate([ids], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert got[0].token_ids == ref[0, len(ids):].tolist()


def test_q6_k_and_q5_0_blocks_are_read_as_gguf_py_reads_them():
    """graft's int8 codes and scales of any Q6_K / Q5_0 / Q8_0 bytes dequantize to gguf-py's
    (transformers') values bit for bit."""
    import numpy as np
    from gguf.quants import GGML_QUANT_SIZES, dequantize

    from graft.gguf_file import _INT8_READERS, INT8_BLOCKS
    from graft.kernels.quant_formats import QuantizedWeight, QuantScheme

    rng = np.random.default_rng(0)
    for kind, group in INT8_BLOCKS.items():
        qtype = gguf.GGMLQuantizationType[kind]
        block, size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, size=(12, size), dtype=np.uint8)
        scale_at = {"Q6_K": slice(208, 210)}.get(kind, slice(0, 2))
        blocks[:, scale_at] = np.frombuffer(np.float16(0.0123).tobytes(), np.uint8)
        want = torch.from_numpy(dequantize(blocks.reshape(3, -1), qtype))
        codes, scales = _INT8_READERS[kind](blocks)
        got = QuantizedWeight(QuantScheme("int8", group), torch.from_numpy(codes).reshape(3, -1),
                              torch.from_numpy(scales).reshape(3, -1)).dequantize()
        assert torch.equal(got, want), kind


def test_a_qwen3_moe_file_holds_its_experts_in_int4(cache, capsys):
    """Qwen3-MoE GGUFs stack each layer's experts per projection (read as transformers reads
    them: test_the_stream_equals_transformers_reading): each expert's linears in int4-g32
    from the blocks (gate Q4_0 and up Q4_1 exactly, down Q4_K to fp16 scales), the greedy
    tokens HF's on the weights the engine holds. transformers reads no expert width from the file; the dir's
    config has it (and HF is given that config)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from graft.gguf_llm import from_pretrained_kwargs

    from graft.cli import main

    path = _file(cache, "qwen3_moe", MOE, overrides=MOE_WIDE)
    assert main(["models", "gguf", str(path)]) == 0
    llm_dir = gguf_llm_dir(path)
    said = capsys.readouterr()
    assert said.out.strip() == str(llm_dir)
    assert "8 Q4_0, 4 Q4_1, 2 Q4_K, 4 Q8_0 tensors" in said.err  # per GGUF tensor (2 layers)
    config = AutoConfig.from_pretrained(llm_dir)
    assert config.moe_intermediate_size == 256
    engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16))
    plan, model = engine.runner.quant_plan, engine.runner.model
    assert plan["layers.1.mlp.experts.7.gate_up_proj"].name == "int4-g32"
    assert plan["layers.1.mlp.experts.7.down_proj"].name == "int4-g32"
    hf = AutoModelForCausalLM.from_pretrained(llm_dir, dtype=torch.float32,
                                              **from_pretrained_kwargs(llm_dir)).eval()
    for i, layer in enumerate(hf.model.layers):
        experts = layer.mlp.experts
        for e in range(config.num_experts):
            for proj in ("gate_up_proj", "down_proj"):
                held = model.linear_weight(f"layers.{i}.mlp.experts.{e}.{proj}").dequantize()
                assert model.get_submodule(f"layers.{i}.mlp.experts.{e}.{proj}").weight.is_meta
                hf_weight = getattr(experts, proj)[e]
                if proj == "gate_up_proj":
                    assert torch.equal(held, hf_weight), (i, e, proj)
                else:
                    assert (held - hf_weight).abs().max() < 1e-3, (i, e, proj)
                    with torch.no_grad():  # HF on the engine's weights: the tokens' reference
                        hf_weight.copy_(held)
    ids = [5, 6, 7, 8]
    got = engine.generate([ids], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert got[0].token_ids == ref[0, len(ids):].tolist()


def _header_only(path, arch: str, **metadata):
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        w.add_uint16(key.replace("_", "."), value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_another_architecture_or_a_split_file_is_refused_in_one_line(cache):
    """From the header, before transformers parses anything; nothing left in the cache."""
    from graft.errors import GraftConfigError

    with pytest.raises(GraftConfigError, match="other.gguf: graft cannot read this GGUF \\(its "
                                               "architecture is 'gemma'\\); graft serves"):
        gguf_llm_dir(_header_only(cache / "other.gguf", "gemma"))
    with pytest.raises(GraftConfigError, match="part 1 of 3 of a split GGUF; join the parts "
                                               "into one file with llama.cpp's `llama-gguf-split --merge"):
        gguf_llm_dir(_header_only(cache / "split.gguf", "llama", split_no=0, split_count=3))
    assert not any((cache / "cache").glob("other-*")) and not any((cache / "cache").glob("split-*"))


def test_the_files_end_of_turn_token_ends_a_generation(cache):
    """llama.cpp ends generation at eos, eot and eom: so does the dir's generation config."""
    import json

    llm = build_llm(cache / "hf-eot", "qwen2")
    path = write_gguf(llm, cache / "eot.gguf", TYPES, eot=7)
    llm_dir = gguf_llm_dir(path)
    eos = json.loads((llm_dir / "generation_config.json").read_text())["eos_token_id"]
    assert isinstance(eos, list) and eos[-1] == 7 and len(eos) == 2
    engine = Engine.from_pretrained(llm_dir, EngineConfig(num_kv_blocks=16))
    assert 7 in engine.eos_token_ids and eos[0] in engine.eos_token_ids
