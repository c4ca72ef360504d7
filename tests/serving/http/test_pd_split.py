"""Prefill/decode split over HTTP in vllm-router's protocol: a prefill worker answers
max_tokens 1 with kv_transfer_params, a decode worker given those pulls the prompt's KV (image
tokens included, so its encoder does not run) and answers what one worker answers."""

import argparse
import ipaddress
import json
import time

import httpx
import pytest
from PIL import Image

from graft.errors import GraftConfigError
from graft.serving.engine.kv_nixl import nixl_module
from graft.serving.http.fleet.pd import parse_kv_transfer_config
from graft.serving.multimodal.media import to_data_url
from tests.serving.http.conftest import LiveServer
from tests.serving.http.test_http import _wait_idle

IMAGE = Image.new("RGB", (32, 32), (30, 160, 90))
ROUTER_PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False,
                         "remote_engine_id": None, "remote_block_ids": None,
                         "remote_host": None, "remote_port": None}  # what vllm-router sends


def _worker(run_dir, role, transport="auto"):
    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    argv = [str(run_dir), "--served-model-name", "tiny", "--max-model-len", "256",
            "--num-kv-blocks", "64", "--block-size", "8"]
    if role is not None:
        argv += ["--kv-transfer-config", json.dumps(
            {"kv_role": role, "kv_connector_extra_config": {"transport": transport}})]
    server = LiveServer(serve_cli.build(parser.parse_args(argv)))
    server.app.state.ctx.advertised_address = ("127.0.0.1", server.port)
    return server


@pytest.fixture(scope="module", params=["http", "nixl"])
def workers(request, tiny_run_dir):
    """Prefill and decode workers moving KV over HTTP or NIXL, and one worker alone."""
    if request.param == "nixl" and nixl_module() is None:
        pytest.skip("NIXL is not installed (pip install --no-deps nixl-cu12)")
    with _worker(tiny_run_dir, "kv_both", request.param) as prefill, \
            _worker(tiny_run_dir, "kv_both", request.param) as decode, \
            _worker(tiny_run_dir, None) as alone:
        assert (decode.app.state.ctx.nixl is not None) == (request.param == "nixl")
        # what prefill_peers in the decode worker's config would say (the port is known now)
        decode.app.state.ctx.kv_transfer.prefill_peers = (("127.0.0.1", prefill.port),)
        yield prefill, decode, alone


def _released(server, timeout=30.0):
    """Every block back in the pool once the exporter heard its KV was read (NIXL tells it
    after the read, on its engine thread)."""
    _wait_idle(server)
    ctx = server.app.state.ctx
    end = time.monotonic() + timeout
    while ctx.engine.kv_exports.held and time.monotonic() < end:
        time.sleep(0.05)
    bm = ctx.engine.block_manager
    return not ctx.engine.kv_exports.held and bm.num_free_blocks == bm.num_blocks


def _body(text, image=True, **extra):
    content = [{"type": "text", "text": text}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": to_data_url(IMAGE)}})
    return {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}


def _post(server, body):
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def _via_router_protocol(prefill, decode, body):
    """What vllm-router --vllm-pd-disaggregation does with one request."""
    first = _post(prefill, {**body, "max_tokens": 1, "stream": False,
                            "kv_transfer_params": ROUTER_PREFILL_PARAMS})
    assert first.status_code == 200, first.text
    params = first.json()["kv_transfer_params"]
    return params, _post(decode, {**body, "kv_transfer_params": params})


@pytest.mark.parametrize("image", [True, False])
def test_split_answers_equal_one_worker_and_skip_prefill_and_encoder(workers, image):
    prefill, decode, alone = workers
    body = _body("Describe what you see in a few words, please." * 3, image=image)
    dctx = decode.app.state.ctx
    stats = dctx.engine.kv_exports.stats
    encodes, imported, by = dctx.front.encode_calls, stats.imported_tokens, \
        dict(stats.imports_by_transport)
    params, answer = _via_router_protocol(prefill, decode, body)
    assert params["do_remote_prefill"] is True and params["remote_port"] == prefill.port
    assert params["remote_block_ids"]  # vLLM's field: the blocks held on the prefill worker
    assert answer.status_code == 200, answer.text
    expected = _post(alone, body).json()["choices"][0]["message"]["content"]
    assert answer.json()["choices"][0]["message"]["content"] == expected
    usage = answer.json()["usage"]
    n_prompt = usage["prompt_tokens"]
    assert stats.imported_tokens - imported == n_prompt - 1
    assert usage["prompt_tokens_details"] == {"cached_tokens": n_prompt - 1,
                                              "transferred_tokens": n_prompt - 1}
    transport = "nixl" if dctx.nixl is not None else "http"
    assert stats.imports_by_transport[transport] == by.get(transport, 0) + 1
    assert dctx.front.encode_calls == encodes  # the image's KV came with the prompt
    assert _released(prefill) and _released(decode)


def test_a_failed_pull_is_prefilled_on_the_decode_worker(workers):
    prefill, decode, alone = workers
    body = _body("Tell me a story about a fox.", image=False)
    stats = decode.app.state.ctx.engine.kv_exports.stats
    failures = stats.import_failures
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_host": "127.0.0.1",
              "remote_port": prefill.port, "remote_request_id": "chatcmpl-never-prefilled",
              "remote_block_ids": [], "remote_engine_id": "x", "tp_size": 1}
    answer = _post(decode, {**body, "kv_transfer_params": params})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == \
        _post(alone, body).json()["choices"][0]["message"]["content"]
    assert stats.import_failures == failures + 1 and stats.failure_reasons["pull"] >= 1


def test_kv_is_pulled_only_from_listed_prefill_peers(workers):
    """A request cannot point the decode worker at another host: it would send that host the
    worker's API key and write what comes back into the prefix cache other users share."""
    import socket

    _, decode, _ = workers
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen(4)
        trap.setblocking(False)
        params = {"do_remote_prefill": True, "remote_host": "127.0.0.1",
                  "remote_port": trap.getsockname()[1], "remote_request_id": "x1"}
        r = _post(decode, _body("hi", image=False, kv_transfer_params=params))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["param"], err["code"]) == ("kv_transfer_params.remote_host", "kv_transfer_peer")
        assert f"127.0.0.1:{trap.getsockname()[1]} is not one of" in err["message"]
        assert "prefill_peers" in err["message"]
        with pytest.raises(BlockingIOError):
            trap.accept()  # nothing connected to it
    assert _released(decode)


def test_kv_is_handed_out_once(workers):
    prefill, decode, _ = workers
    params, answer = _via_router_protocol(prefill, decode, _body("Once only.", image=False))
    assert answer.status_code == 200 and _released(prefill)
    again = httpx.get(f"{prefill.url}/v1/graft/kv_transfer/{params['remote_request_id']}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "kv_not_found"


@pytest.mark.parametrize("extra, param, code", [
    ({"kv_transfer_params": ROUTER_PREFILL_PARAMS}, "kv_transfer_params", "kv_transfer_disabled"),
    ({"bootstrap_room": 7, "bootstrap_host": "h"}, "bootstrap_host", "unsupported_parameter"),
])
def test_fields_that_change_meaning_are_refused_not_ignored(workers, extra, param, code):
    _, _, alone = workers
    r = _post(alone, _body("hi", image=False, **extra))
    assert r.status_code == 400
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, code)


@pytest.mark.parametrize("params, where", [
    ({"do_remote_decode": True, "do_remote_prefill": True}, "both"),
    ({"do_remote_prefill": True, "remote_host": "127.0.0.1"}, "remote_port"),
    ({"do_remote_decode": "yes"}, "true or false"),
    ({"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 80,
      "remote_request_id": "../../v1/models?"}, "remote_request_id"),
    ({"do_remote_prefill": True, "remote_host": "user@evil/x", "remote_port": 80,
      "remote_request_id": "abc"}, "remote_host"),
])
def test_malformed_kv_transfer_params_are_named(workers, params, where):
    prefill, _, _ = workers
    r = _post(prefill, _body("hi", image=False, kv_transfer_params=params))
    assert r.status_code == 400 and where in r.json()["error"]["message"]


def test_a_streamed_prefill_half_is_refused(workers):
    prefill, _, _ = workers
    r = _post(prefill, _body("hi", image=False, stream=True,
                             kv_transfer_params=ROUTER_PREFILL_PARAMS))
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ("[]", "JSON object"),
    ('{"kv_role": "leader"}', "kv_role must be one of"),
    ('{"kv_role": "kv_both", "kv_connector": "NixlConnector"}', "not available in graft"),
    ('{"kv_role": "kv_both", "kv_buffer_size": 1}', "unknown field 'kv_buffer_size'"),
    ('{"kv_role": "kv_both", "kv_connector_extra_config": {"pull_timeout_s": -1}}', "seconds"),
])
def test_bad_kv_transfer_config_is_one_line(text, message):
    with pytest.raises(GraftConfigError, match=message):
        parse_kv_transfer_config(text)


@pytest.mark.parametrize("peers, message", [
    ('"10.0.0.2:8001"', "must be a list"),
    ('["10.0.0.2"]', "10.0.0.2' is not"),
    ('["10.0.0.2:0"]', "is not"),
    ('["user@h:80"]', "is not"),
    ('["*", "10.0.0.2:8001"]', "is not"),
])
def test_bad_prefill_peers_are_one_line(peers, message):
    text = '{"kv_role": "kv_consumer", "kv_connector_extra_config": {"prefill_peers": %s}}'
    with pytest.raises(GraftConfigError, match=message):
        parse_kv_transfer_config(text % peers)


def test_prefill_peers_parse_to_host_port_pairs():
    text = '{"kv_role": "kv_consumer", "kv_connector_extra_config": {"prefill_peers": %s}}'
    config = parse_kv_transfer_config(text % '["Prefill-0.local:8001", "[::1]:8002"]')
    assert config.prefill_peers == (("prefill-0.local", 8001), ("::1", 8002))
    assert parse_kv_transfer_config(text % '["*"]').prefill_peers == ("*",)
    pods = parse_kv_transfer_config(text % '["10.1.0.0/16:*", "fd00::/8:8001"]')
    assert pods.prefill_peers == ((ipaddress.ip_network("10.1.0.0/16"), None),
                                  (ipaddress.ip_network("fd00::/8"), 8001))


@pytest.mark.parametrize("host, port, allowed", [
    ("10.1.2.3", 9000, True), ("10.2.0.1", 9000, False), ("fd00::5", 8001, True),
    ("fd00::5", 8002, False), ("prefill-0.local", 8001, True), ("PREFILL-0.local", 8001, True),
    ("prefill-0.local", 8002, False), ("10.1.2.3.nip.io", 9000, False),
])
def test_a_request_names_a_listed_peer_or_is_refused(host, port, allowed):
    from graft.serving.http.fleet.pd import _is_peer

    config = parse_kv_transfer_config(
        '{"kv_role": "kv_consumer", "kv_connector_extra_config": {"prefill_peers": '
        '["10.1.0.0/16:*", "fd00::/8:8001", "Prefill-0.local:8001"]}}')
    assert _is_peer(config.prefill_peers, host, port) is allowed
    assert parse_kv_transfer_config('{"kv_role": "kv_consumer"}').prefill_peers == ()


def test_kv_transfer_config_takes_vllms_fields():
    config = parse_kv_transfer_config(
        '{"kv_role": "kv_producer", "kv_ip": "10.0.0.2", "engine_id": "p0",'
        ' "kv_connector_extra_config": {"export_ttl_s": 5}}')
    assert (config.produces, config.consumes, config.export_ttl_s) == (True, False, 5.0)


def test_through_vllm_router_pd_mode(workers, tmp_path):
    """The untouched vllm-router in --vllm-pd-disaggregation mode (its nixl request protocol)
    in front of the two workers: the decode worker's prompt KV came from the prefill worker."""
    from tests.serving.http.router_proc import Router, free_port, vllm_router

    prefill, decode, alone = workers
    argv = [vllm_router(), "--vllm-pd-disaggregation", "--prefill", prefill.url,
            "--decode", decode.url, "--prometheus-port", str(free_port())]
    stats = decode.app.state.ctx.engine.kv_exports.stats
    imported = stats.imported_tokens
    body = _body("Through the router, with an image.")
    with Router(argv, tmp_path / "router.log") as router:
        r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == \
        _post(alone, body).json()["choices"][0]["message"]["content"]
    usage = r.json()["usage"]
    assert stats.imported_tokens - imported == usage["prompt_tokens"] - 1
    # the router reports the prefill worker's own cache hits as cached_tokens (vLLM's rule for
    # P/D) and keeps graft's transferred_tokens beside it
    assert usage["prompt_tokens_details"]["transferred_tokens"] == usage["prompt_tokens"] - 1


def test_transfers_are_counted_in_the_metrics(workers):
    prefill, decode, _ = workers
    _via_router_protocol(prefill, decode, _body("Count me.", image=False))
    text = httpx.get(decode.url + "/metrics").text
    imported = [line for line in text.splitlines()
                if line.startswith("graft_kv_transfer_imported_tokens_total")]
    assert imported and float(imported[0].split()[-1]) > 0
    assert text.count("# TYPE graft_kv_transfer_failures_total counter") == 1
    assert 'graft_kv_transfer_failures_total{reason="pull"}' in text
    prefill_metrics = httpx.get(prefill.url + "/metrics").text
    assert "graft_kv_transfer_exports_total" in prefill_metrics
    assert "graft_kv_transfer_export_evicted_total 0" in prefill_metrics
