"""`graft fleet`: the plan of processes (CPUs split, ports, router flags per layout), and a
real fleet of two workers behind vllm-router that Ctrl-C stops whole."""

import argparse
import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from graft.errors import GraftConfigError
from graft.serving.http.fleet import fleet_cli
from graft.serving.http.fleet.pd import parse_kv_transfer_config


def _args(*argv):
    parser = argparse.ArgumentParser()
    fleet_cli.add_arguments(parser)
    return fleet_cli.parse_args(parser, ["model", *argv])


def _plan(*argv, cpus=(0, 1, 2, 3)):
    ports = iter(range(40000, 40100))
    return fleet_cli.plan(_args(*argv), list(cpus), "/bin/vllm-router", lambda: next(ports))


def test_replicas_split_the_cpus_and_sit_behind_cache_aware_routing():
    fleet = _plan("--replicas", "2", "--port", "9000", "--", "--max-model-len", "512")
    assert [w.cpus for w in fleet.workers] == [[0, 1], [2, 3]]
    assert [w.env["OMP_NUM_THREADS"] for w in fleet.workers] == ["2", "2"]
    assert [w.url for w in fleet.workers] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    a = fleet.workers[0].argv
    assert a[a.index("--max-model-len") + 1] == "512"
    assert a[a.index("--encoder-cache-peers") + 1:][:1] == ["http://127.0.0.1:9002"]
    r = fleet.router.argv
    assert r[r.index("--policy") + 1] == "cache_aware"
    assert r[r.index("--worker-urls") + 1:][:2] == [w.url for w in fleet.workers]


def test_encoder_cache_peers_can_be_turned_off():
    fleet = _plan("--replicas", "2", "--no-encoder-cache-peers")
    assert all("--encoder-cache-peers" not in w.argv for w in fleet.workers)


def test_a_pd_layout_gives_roles_and_the_routers_pd_mode():
    fleet = _plan("--pd", "1:2", cpus=(0, 1, 2))
    configs = [json.loads(w.argv[w.argv.index("--kv-transfer-config") + 1])
               for w in fleet.workers]
    assert [c["kv_role"] for c in configs] == ["kv_producer"] + ["kv_consumer"] * 2
    # each decode worker pulls only from the prefill worker, at the address it advertises
    prefill_port = fleet.workers[0].url.rsplit(":", 1)[1]
    assert "kv_connector_extra_config" not in configs[0]
    for c in configs[1:]:
        assert c["kv_connector_extra_config"] == {"prefill_peers": [f"127.0.0.1:{prefill_port}"]}
        parse_kv_transfer_config(json.dumps(c))
    r = fleet.router.argv
    assert "--vllm-pd-disaggregation" in r
    assert r[r.index("--prefill") + 1] == fleet.workers[0].url
    assert [r[i + 1] for i, a in enumerate(r) if a == "--decode"] == \
        [w.url for w in fleet.workers[1:]]


def test_kv_aware_wires_each_workers_kv_events_to_the_router():
    fleet = _plan("--policy", "kv_aware", "--replicas", "2")
    r = fleet.router.argv
    sources = [r[i + 1] for i, a in enumerate(r) if a == "--kv-event-source"]
    assert [s.split("=")[0] for s in sources] == [w.url for w in fleet.workers]
    for w, source in zip(fleet.workers, sources):
        port = source.rsplit(":", 1)[1]
        assert f'"tcp://*:{port}"' in w.argv[w.argv.index("--kv-events-config") + 1]
    assert r[r.index("--kv-event-model") + 1] == "model"  # the path's name, as graft serve
    assert r[r.index("--kv-event-block-size") + 1] == "16"
    r = _plan("--policy", "kv_aware", "--", "--block-size", "32",
              "--served-model-name", "m").router.argv
    assert (r[r.index("--kv-event-model") + 1], r[r.index("--kv-event-block-size") + 1]) == \
        ("m", "32")


def test_more_workers_than_cpus_share_them():
    assert [w.cpus for w in _plan("--replicas", "3", cpus=(0, 1)).workers] == [[0], [1], [0]]


@pytest.mark.parametrize("argv, message", [
    (["--pd", "0:1"], "at least one of each"),
    (["--pd", "x"], "give P:D"),
    (["--", "--port", "1"], "--port after --"),
    (["--", "--port=1"], "--port after --"),
    (["--", "--host=0.0.0.0"], "--host after --"),
    (["--", "--kv-events-config", '{"enable_kv_cache_events":true}'],
     r"--kv-events-config after --: .*\(see --policy kv_aware\)"),
    (["--", "--encoder-cache-peers", "http://x:1"], "--no-encoder-cache-peers to turn it off"),
    (["--worker-port", "65535", "--replicas", "2"], "ports up to 65536"),
])
def test_bad_layouts_are_one_line(argv, message):
    with pytest.raises(GraftConfigError, match=message):
        _plan(*argv)


def test_an_ipv6_router_host_gives_a_url_the_fleet_can_reach():
    url = _plan("--host", "::1", "--port", "9000").router.url
    assert url == "http://[::1]:9000"
    assert httpx.URL(url).port == 9000  # what the /health wait asks


def test_a_router_path_that_is_not_there_is_named():
    with pytest.raises(GraftConfigError, match="--router /nonexistent/vllm-router"):
        fleet_cli.find_router("/nonexistent/vllm-router")


def test_a_fleet_serves_through_the_router_and_ctrl_c_stops_all(tiny_llama, tmp_path):
    from graft.serving.http.fleet.fleet_cli import free_port_run
    from tests.serving.http.router_proc import vllm_router

    port = free_port_run(3)  # the router's and, after it, the two workers'
    env = {**os.environ, "GRAFT_VLLM_ROUTER": vllm_router(), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "graft.cli", "fleet", str(tiny_llama),
                             "--replicas", "2", "--port", str(port), "--startup-timeout-s",
                             "300", "--", "--served-model-name", "tiny"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        lines = []
        for line in proc.stdout:  # until it says where everything is
            lines.append(line)
            if "router log:" in line:
                break
        assert any(f"127.0.0.1:{port}/v1" in line for line in lines), "".join(lines)
        workers = [line.split()[2] for line in lines if line.strip().startswith("worker ")]
        assert len(workers) == 2
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    for url in workers:  # every worker is gone with it
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)


def test_a_port_run_is_taken_below_the_outgoing_connections_range():
    """Ports a worker binds seconds after they were checked must not be ones the kernel hands
    to outgoing connections meanwhile (a bench fleet's worker once lost its port that way)."""
    import socket

    from graft.serving.http.fleet.fleet_cli import _ephemeral_low, free_port_run

    base = free_port_run(4)
    assert base + 3 < _ephemeral_low()
    socks = [socket.socket() for _ in range(4)]
    try:
        for k, s in enumerate(socks):
            s.bind(("127.0.0.1", base + k))
    finally:
        for s in socks:
            s.close()
