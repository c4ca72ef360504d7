"""The FSDP plan against a real two-rank CPU run (gloo) of an embedding-heavy LLM, where the
root unit (embeddings and LM head, gathered whole for the forward and backward) is most of
what a rank holds: the plan's bytes per rank must match the measured growth of peak memory.

What is compared: on rank 1 (the rank that does not read the LLM's weights; rank 0 holds the
whole LLM once while loading, before it shards), peak RSS at the end of training minus peak
RSS just before the model loads (both ru_maxrss, in train_summary.json), against the plan's
fsdp total (shard + root unit + two decoder layers + one all-gather buffer + encoder +
trainable state + activations at the longest sample's length). Measured 2026-12-05: plan
375.5 MiB, rank 1 grew by 375.9-379.4 MiB (docs/training.md)."""

import json

import pytest

from graft.train.dry_run import dry_run
from graft.train.plan import make_plan
from tests.graft.train.launch import launch_train
from tests.tiny_llm import build_llm

# 64k-token vocabulary of width 256, untied: embeddings and LM head are 128 MiB of 133 MiB
WIDE_VOCAB = {"vocab_size": 65536, "hidden_size": 256, "intermediate_size": 512, "head_dim": 64}


@pytest.mark.slow
def test_the_fsdp_plan_matches_the_measured_peak_of_two_ranks(make_spec, tmp_path):
    llm = build_llm(tmp_path / "llm", "qwen2", config_overrides=WIDE_VOCAB)
    spec = make_spec(llm=llm, batch_size=1, max_steps=3, sharding="fsdp")
    seq_len = dry_run(spec)["data"]["train"]["tokens_max"]
    plan = make_plan(spec, world_size=2, seq_len=seq_len)
    fsdp = plan["strategies"]["fsdp"]
    assert plan["llm"]["root_unit_bytes"] > 0.9 * plan["llm"]["bytes"]  # embedding-heavy indeed
    spec.save(tmp_path / "spec.yaml")
    proc = launch_train(tmp_path / "spec.yaml", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["llm_weights_read_per_rank"] == [True, False]
    grown = summary["peak_rss_bytes_per_rank"][1] - summary["peak_rss_before_model_bytes_per_rank"][1]
    print(f"plan {fsdp['total_bytes'] / 2**20:.1f} MiB, measured {grown / 2**20:.1f} MiB")
    assert fsdp["total_bytes"] == pytest.approx(grown, rel=0.15)
    # the plan before it counted the root unit (and its gather) said less than a third of it
    before = fsdp["total_bytes"] - fsdp["gathered_bytes"] + 2 * plan["llm"]["largest_layer_bytes"]
    assert before < grown / 3
