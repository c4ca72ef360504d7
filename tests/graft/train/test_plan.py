"""`graft train --plan` and the launch-time memory check: config.json only, numbers that are the
model's own, and a run that cannot fit stops in one line before any weight loads."""

import json
import shutil
from pathlib import Path

import pytest

from graft.cli import main
from graft.errors import GraftConfigError
from graft.spec import GraftSpec
from graft.train.loop import train
from graft.train.plan import make_plan, parse_bytes
from tests.graft.cli_asserts import fails

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "moonvit-glm45air" / "graft.yaml"


def _config_only(llm_dir: Path, out: Path) -> Path:
    """The LLM dir's config.json alone: no weights, no tokenizer."""
    out.mkdir(parents=True)
    shutil.copy(llm_dir / "config.json", out / "config.json")
    return out


@pytest.mark.parametrize("family", ["llama", "glm4_moe", "qwen3_moe"])
def test_plan_counts_the_model_exactly_from_its_config(family, tiny_llm_factory, make_spec, tmp_path):
    from transformers import AutoModelForCausalLM

    llm_dir = tiny_llm_factory(family)
    real = AutoModelForCausalLM.from_pretrained(llm_dir)
    spec = make_spec(llm=_config_only(llm_dir, tmp_path / "cfg"))
    plan = make_plan(spec, world_size=2, device_memory=10 ** 12)
    params = sum(p.numel() for p in real.parameters())
    assert plan["llm"]["params"] == params and plan["llm"]["bytes"] == 4 * params
    layer = max(sum(p.numel() for p in x.parameters()) for x in real.model.layers) * 4
    assert plan["llm"]["largest_layer_bytes"] == layer
    fsdp, ddp = plan["strategies"]["fsdp"], plan["strategies"]["none"]
    # the root unit: everything outside the decoder layers (a tied embedding once), projector too
    outside = params - sum(sum(p.numel() for p in x.parameters()) for x in real.model.layers)
    projector = plan["trainable"]["params"]  # align stage: the projector alone trains
    root = 4 * outside + 4 * projector
    assert plan["llm"]["root_unit_bytes"] == root
    assert fsdp["llm_bytes"] == -(-4 * params // 2) + root + 2 * layer + max(root, layer)
    assert ddp["llm_bytes"] == 4 * params
    assert fsdp["fits"] and ddp["fits"]
    moe = plan["llm"]["moe"]
    if family == "llama":
        assert moe is None
    else:
        experts = sum(p.numel() for n, p in real.named_parameters() if ".experts." in n)
        n = getattr(real.config, "num_experts", None) or real.config.n_routed_experts
        k = real.config.num_experts_per_tok
        assert moe["experts"] == n and moe["experts_per_token"] == k and n > k
        assert moe["routed_params"] == experts
        assert moe["inactive_params_per_token"] == experts - experts * k // n


@pytest.mark.parametrize("kind, encoder", [("timm_cnn", {"cnn_stage": [3, 0], "cnn_downsample": "global_max"}),
                                           ("timm_vit", {"feature_layer": -2})])
def test_plan_sizes_a_timm_encoder_as_it_runs(kind, encoder, make_spec, tiny_llama, tmp_path):
    """cnn_stage sets the projector's input width and drops later stages; feature_layer prunes
    later ViT blocks: the plan counts the encoder and projector that training builds."""
    from transformers import AutoConfig

    from graft.adapters.registry import build_adapter
    from graft.encoders.timm_encoder import TimmEncoder

    raw = make_spec(kind=kind).to_dict()
    raw["encoder"].update(encoder)
    spec = GraftSpec.from_dict(raw)
    real = TimmEncoder(spec.encoder_config())
    d_model = AutoConfig.from_pretrained(tiny_llama).hidden_size
    projector = build_adapter(spec.adapter_config(), real.hidden_size, d_model)
    plan = make_plan(spec, world_size=1, device_memory=10 ** 12)
    assert plan["encoder"]["params"] == sum(p.numel() for p in real.model.parameters())
    assert plan["trainable"]["params"] == sum(p.numel() for p in projector.parameters())


def test_plan_cli_on_the_documented_example(capsys):
    assert main(["train", str(EXAMPLE), "--plan", "--world-size", "8", "--device-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "(glm4_moe): 106.8" in out and "128 experts, 8 per token" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ")}
    assert lines["none"].endswith("does NOT fit") and lines["fsdp"].endswith("fits")
    assert out.rstrip().endswith("fits: train.sharding=fsdp")


def test_plan_json_is_the_plan(capsys):
    assert main(["train", str(EXAMPLE), "--plan", "--json", "--world-size", "8",
                 "--device-memory", "80GiB"]) == 0
    plan = json.loads(capsys.readouterr().out)
    fsdp = plan["strategies"]["fsdp"]
    assert plan["world_size"] == 8 and plan["device_memory"] == 80 * 2 ** 30 and fsdp["fits"]
    # GLM-4.5-Air: the root unit (embeddings + LM head, 151552 x 4096 each, bf16) and projector
    assert plan["llm"]["root_unit_bytes"] >= 2 * 151552 * 4096 * 2
    assert fsdp["llm_bytes"] == fsdp["shard_bytes"] + fsdp["gathered_bytes"]


def test_plan_prints_mib(capsys):
    assert main(["train", str(EXAMPLE), "--plan", "--world-size", "8", "--device-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "81,920 MiB each:" in out and "GiB" not in out


def test_plan_cli_errors_are_one_line(capsys):
    fails(capsys, ["train", str(EXAMPLE), "--plan", "--device-memory", "eighty"],
          "--device-memory='eighty': expected a size such as 80GiB")
    fails(capsys, ["train", str(EXAMPLE), "--plan", "--world-size", "0"], "--world-size: 0 is out of range")
    # a shard of nothing would "fit" any device: the world size is bounded
    fails(capsys, ["train", str(EXAMPLE), "--plan", "--world-size", "1000000000000"],
          "--world-size: 1000000000000 is out of range: use 1 <= value <= 1048576")
    fails(capsys, ["train", str(EXAMPLE), "--json"], "--json goes with --plan")


def test_sizes_parse():
    assert parse_bytes("80GiB") == 80 * 2 ** 30 and parse_bytes("80GB") == 80 * 10 ** 9
    assert parse_bytes("1.5 MiB") == 3 * 2 ** 19 and parse_bytes(4096) == 4096
    with pytest.raises(GraftConfigError, match="train.device_memory='-1GiB'"):
        parse_bytes("-1GiB", "train.device_memory")


def test_a_run_that_cannot_fit_stops_before_loading(make_spec, tiny_llama, tmp_path):
    # no weights and no tokenizer in the LLM dir: any load would fail with another error
    spec = make_spec(llm=_config_only(tiny_llama, tmp_path / "cfg"), device_memory="64KiB")
    with pytest.raises(GraftConfigError) as err:
        train(spec)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("train.sharding=none on 1 rank(s): each rank needs")
    assert "but has 0.06 MiB; train.sharding=fsdp needs" in message and "--plan" in message
    assert not (tmp_path / "run").exists()


def test_a_run_that_fits_records_its_memory(make_spec, tmp_path):
    run = train(make_spec(max_steps=1, device_memory="8GiB"))
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["llm_param_bytes_per_rank"] == [summary["llm_param_bytes"]] and not summary["sharded"]
    assert summary["peak_rss_bytes_per_rank"][0] > summary["llm_param_bytes"]
