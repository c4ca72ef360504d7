"""`graft bench fleet`: a real (tiny) run through vllm-router writes the JSON the docs' table
is made from; the summary is min/median/max over runs."""

import json

import pytest

from graft.benchmarks import fleet
from graft.errors import GraftConfigError


def test_summary_is_min_median_max_of_each_number():
    runs = [{"hit_rate": 0.9, "failed": 0, "note": "x"}, {"hit_rate": 0.7, "failed": 1},
            {"hit_rate": 0.8, "failed": 0}]
    assert fleet.summarize_runs(runs) == {"hit_rate": {"min": 0.7, "median": 0.8, "max": 0.9},
                                          "failed": {"min": 0, "median": 0, "max": 1}}


def test_images_need_a_run_dir(tiny_llama, monkeypatch):
    import argparse

    parser = argparse.ArgumentParser()
    fleet.add_arguments(parser)
    args = fleet.parse_args(parser, [str(tiny_llama), "--workloads", "images"])
    with pytest.raises(GraftConfigError, match="needs a run dir"):
        fleet.run(args)


def test_a_tiny_fleet_run_writes_its_report(tiny_llama, tmp_path, monkeypatch):
    import argparse

    from tests.serving.http.router_proc import vllm_router

    monkeypatch.setenv("GRAFT_VLLM_ROUTER", vllm_router())
    parser = argparse.ArgumentParser()
    fleet.add_arguments(parser)
    out = tmp_path / "fleet.json"
    args = fleet.parse_args(parser, [
        str(tiny_llama), "--workloads", "prefix,pd", "--policies", "cache_aware", "--runs", "1",
        "--groups", "2", "--chats", "3", "--clients", "2", "--system-tokens", "120",
        "--long-tokens", "200", "--out", str(out), "--", "--max-model-len", "512"])
    assert fleet.run(args) == 0
    report = json.loads(out.read_text())
    prefix = report["prefix"]["cache_aware"]["runs"][0]
    assert prefix["failed"] == 0 and 0.0 < prefix["hit_rate"] <= 1.0
    split = report["pd"]["split"]["runs"][0]
    assert split["failed"] == 0 and split["transferred_tokens"] > 0
    assert report["pd"]["both_roles"]["runs"][0]["transferred_tokens"] == 0
