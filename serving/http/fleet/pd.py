"""Prefill/decode split over HTTP, in vllm-router's protocol (`--vllm-pd-disaggregation`).

The router sends the prefill worker the request with `max_tokens: 1` and
`kv_transfer_params: {"do_remote_decode": true, ...}`; the answer carries
`kv_transfer_params` naming where the prompt's KV waits (vLLM NixlConnector's fields). The
router hands those to the decode worker with the original request; that worker pulls the KV
(graft's connector: one HTTP GET of the prefill worker's /v1/graft/kv_transfer/{id}) and
decodes without prefilling. A failed pull is never an error for the client: the decode worker
prefills the prompt itself and counts it. It pulls only from the prefill workers its
config lists (prefill_peers), whatever host a request names.

Fields that would change a request's meaning are honoured or refused (400), never ignored:
`kv_transfer_params` on a worker started without --kv-transfer-config, and sglang-router's
`bootstrap_*` P/D fields, whose protocol graft does not speak.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
from dataclasses import dataclass, field

from graft.errors import GraftConfigError
from graft.serving.engine.kv_nixl import nixl_module
from graft.serving.engine.kv_transfer import (DEFAULT_EXPORT_TTL_S, KVPayload, NixlSource,
                                              decode_payload)
from graft.serving.http.openai import openai_chat as P
from graft.serving.http.plumbing.auth import peer_headers

log = logging.getLogger("graft.serving")

PULL_PATH = "/v1/graft/kv_transfer/{request_id}"
META_PATH = PULL_PATH + "/meta"
ROLES = ("kv_producer", "kv_consumer", "kv_both")
CONNECTORS = ("GraftConnector",)
TRANSPORTS = ("auto", "nixl", "http")
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


@dataclass
class KVTransferConfig:
    """`graft serve --kv-transfer-config JSON`: vLLM's flag and field names."""
    kv_role: str  # kv_producer (prefill only) | kv_consumer (decode only) | kv_both
    kv_connector: str = "GraftConnector"
    kv_ip: str | None = None  # the host decode workers reach this one at (default: --host)
    engine_id: str | None = None  # names this worker in kv_transfer_params (default: host:port)
    kv_connector_extra_config: dict = field(default_factory=dict)
    pull_timeout_s: float = 30.0  # from kv_connector_extra_config
    export_ttl_s: float = DEFAULT_EXPORT_TTL_S  # from kv_connector_extra_config
    transport: str = "auto"  # from kv_connector_extra_config: auto (NIXL where both have it)
    # from kv_connector_extra_config: the (host, port)s a do_remote_prefill may name; "*": any
    prefill_peers: tuple = ()

    @property
    def produces(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def consumes(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")


def parse_kv_transfer_config(text: str) -> KVTransferConfig:
    """The flag's JSON; GraftConfigError naming the field and the fix otherwise."""
    flag = "--kv-transfer-config"
    try:
        raw = json.loads(text) if isinstance(text, str) else text
    except ValueError as err:
        raise GraftConfigError(f"{flag} is not JSON ({err}); e.g. '{{\"kv_role\":\"kv_both\"}}'")
    if not isinstance(raw, dict):
        raise GraftConfigError(f"{flag} must be a JSON object, e.g. '{{\"kv_role\":\"kv_both\"}}'")
    known = {"kv_role", "kv_connector", "kv_ip", "engine_id", "kv_connector_extra_config"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise GraftConfigError(f"{flag}: unknown field {unknown[0]!r}; graft's connector takes "
                               f"{', '.join(sorted(known))}")
    if raw.get("kv_role") not in ROLES:
        raise GraftConfigError(f"{flag}: kv_role must be one of {', '.join(ROLES)}, got "
                               f"{raw.get('kv_role')!r}")
    connector = raw.get("kv_connector") or "GraftConnector"
    if connector not in CONNECTORS:
        raise GraftConfigError(
            f"{flag}: kv_connector {connector!r} is not available in graft; leave it out "
            "(graft's own connector, GraftConnector, moves KV between graft workers)")
    extra = raw.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict) or set(extra) - {"pull_timeout_s", "export_ttl_s",
                                                    "transport", "prefill_peers"}:
        raise GraftConfigError(f"{flag}: kv_connector_extra_config takes pull_timeout_s and "
                               "export_ttl_s (seconds), transport (auto, nixl, http) and "
                               "prefill_peers (a list of \"host:port\")")
    numbers = {}
    if extra.get("transport", "auto") not in TRANSPORTS:
        raise GraftConfigError(f"{flag}: kv_connector_extra_config.transport must be one of "
                               f"{', '.join(TRANSPORTS)}, got {extra['transport']!r}")
    if extra.get("transport") == "nixl" and nixl_module() is None:
        raise GraftConfigError(f"{flag}: transport nixl, but NIXL is not installed here "
                               "(pip install --no-deps nixl-cu12), or use transport auto")
    for key in ("pull_timeout_s", "export_ttl_s"):
        if key in extra:
            value = extra[key]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not 0 < value < 1e6:
                raise GraftConfigError(f"{flag}: kv_connector_extra_config.{key} must be a "
                                       f"number of seconds in (0, 1e6), got {value!r}")
            numbers[key] = float(value)
    for key in ("kv_ip", "engine_id"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise GraftConfigError(f"{flag}: {key} must be a string, got {raw[key]!r}")
    return KVTransferConfig(raw["kv_role"], connector, raw.get("kv_ip"), raw.get("engine_id"),
                            extra, **numbers, transport=extra.get("transport", "auto"),
                            prefill_peers=_peers(extra.get("prefill_peers", []), flag))


def _peers(value, flag: str) -> tuple:
    """prefill_peers: ("*",), or (host, port) pairs: host a lower-cased name or address, or an
    ip_network; port None for any ("10.0.0.0/8:*", a pod network whose addresses change)."""
    where = f"{flag}: kv_connector_extra_config.prefill_peers"
    if not isinstance(value, list):
        raise GraftConfigError(f"{where} must be a list of \"host:port\" strings (the "
                               "remote_host and remote_port the prefill workers answer with)")
    if value == ["*"]:
        return ("*",)
    peers = []
    for entry in value:
        host, _, port = entry.rpartition(":") if isinstance(entry, str) else ("", "", "")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            net = ipaddress.ip_network(host) if "/" in host else None
        except ValueError:
            net = None
        if not ((net is not None or _HOST.fullmatch(host))
                and (port == "*" or port.isdigit() and 0 < int(port) < 65536)):
            raise GraftConfigError(f"{where}: {entry!r} is not \"host:port\" (e.g. "
                                   "\"10.0.0.2:8001\", \"[::1]:8001\", \"10.0.0.0/8:*\"), or give "
                                   "[\"*\"] alone to pull from any host a request names")
        peers.append((net or host.lower(), None if port == "*" else int(port)))
    return tuple(peers)


def _is_peer(peers: tuple, host: str, port: int) -> bool:
    if "*" in peers:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None  # a name: matched as written, never resolved here
    for want, want_port in peers:
        if want_port not in (None, port):
            continue
        if want == host.lower() or (address is not None and not isinstance(want, str)
                                    and address in want):
            return True
    return False


def advertised_address(args, config: KVTransferConfig | None) -> tuple[str, int]:
    """(host, port) a decode worker pulls from: kv_ip, else --host unless it is a wildcard
    (then this machine's name), with the API port."""
    import socket

    host = (config.kv_ip if config is not None else None) or args.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return host, args.port


@dataclass
class PullSpec:
    url: str  # where the prompt's KV waits (PULL_PATH; META_PATH is url + "/meta")
    request_id: str


@dataclass
class Transfer:
    export: bool = False  # hold the prompt's KV for a decode worker (prefill side)
    pull: PullSpec | None = None  # take the prompt's KV from a prefill worker (decode side)


def transfer_for(config: KVTransferConfig | None, req) -> Transfer:
    """What a request's P/D fields ask of this worker; APIError(400) for what it cannot do."""
    for name in BOOTSTRAP_FIELDS:
        if getattr(req, name, None) is not None:
            raise P.APIError(
                f"{name}: sglang-router's prefill/decode bootstrap protocol is not supported by "
                "graft; run the P/D split through vllm-router --vllm-pd-disaggregation "
                "(docs/fleet.md)", param=name, code="unsupported_parameter")
    params = getattr(req, "kv_transfer_params", None)
    if params is None:
        return Transfer()
    if config is None:
        raise P.APIError("kv_transfer_params: this worker takes no part in a prefill/decode "
                         "split; start it with --kv-transfer-config '{\"kv_role\":\"kv_both\"}'",
                         param="kv_transfer_params", code="kv_transfer_disabled")
    remote_decode = _flag(params, "do_remote_decode")
    remote_prefill = _flag(params, "do_remote_prefill")
    if remote_decode and remote_prefill:
        raise P.APIError("kv_transfer_params: do_remote_decode and do_remote_prefill are both "
                         "true; a request is either the prefill or the decode half",
                         param="kv_transfer_params", code="invalid_value")
    if remote_decode:
        if not config.produces:
            raise _wrong_role("do_remote_decode", config)
        if req.stream:
            raise P.APIError("kv_transfer_params.do_remote_decode needs stream: false (the "
                             "answer carries kv_transfer_params)", param="stream",
                             code="invalid_value")
        return Transfer(export=True)
    if remote_prefill:
        if not config.consumes:
            raise _wrong_role("do_remote_prefill", config)
        host, port, rid = (params.get("remote_host"), params.get("remote_port"),
                           params.get("remote_request_id"))
        if not (isinstance(host, str) and _HOST.fullmatch(host) and isinstance(rid, str)
                and _REQUEST_ID.fullmatch(rid) and isinstance(port, int)
                and not isinstance(port, bool) and 0 < port < 65536):
            raise P.APIError("kv_transfer_params: do_remote_prefill needs remote_host (a host "
                             "name or address), remote_port (1-65535) and remote_request_id "
                             "(letters, digits, '.', '_', '-'), as the prefill worker's answer "
                             "gives them", param="kv_transfer_params", code="invalid_value")
        _check_peer(config, host, port)
        host = f"[{host}]" if ":" in host else host
        return Transfer(pull=PullSpec(f"http://{host}:{port}" + PULL_PATH.format(request_id=rid),
                                      rid))
    return Transfer()


# what a decode worker puts into the URL it fetches: never a path, query or user part
_HOST = re.compile(r"[A-Za-z0-9.\-]{1,253}|[0-9A-Fa-f:]{2,39}")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._\-]{1,128}")


def _check_peer(config: KVTransferConfig, host: str, port: int) -> None:
    """A decode worker writes what it pulls into its shared prefix cache and sends its API key
    along, so it pulls only from the prefill workers its operator listed, never from wherever
    a request points."""
    if _is_peer(config.prefill_peers, host, port):
        return
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    listed = ", ".join(f"{h}:{p or '*'}" for h, p in config.prefill_peers) or "none"
    raise P.APIError(
        f"kv_transfer_params.remote_host: {shown} is not one of this worker's prefill peers "
        f"({listed}); list it in --kv-transfer-config's kv_connector_extra_config.prefill_peers "
        "(docs/fleet.md)", param="kv_transfer_params.remote_host", code="kv_transfer_peer")


def _flag(params: dict, name: str) -> bool:
    value = params.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise P.APIError(f"kv_transfer_params.{name} must be true or false, got {value!r}",
                         param=f"kv_transfer_params.{name}", code="invalid_value")
    return value


def _wrong_role(name: str, config: KVTransferConfig) -> P.APIError:
    return P.APIError(f"kv_transfer_params.{name}: this worker's kv_role is {config.kv_role}; "
                      "send it to a worker started with kv_role kv_both or the other role",
                      param=f"kv_transfer_params.{name}", code="kv_transfer_role")


FAILURE_REASONS = ("pull", "layout", "prompt_mismatch", "no_room", "transfer")


def transfer_series(engine) -> list:
    """/metrics series of the P/D split, read from the engine's counters."""
    from graft.serving.http.plumbing.vllm_metrics import ReadCounter

    stats = engine.kv_exports.stats
    series = [
        ReadCounter("graft_kv_transfer_exports_total",
                    "Prompts whose KV was held for a decode worker.", lambda: stats.exported),
        ReadCounter("graft_kv_transfer_export_reads_total",
                    "Held prompts a decode worker took.", lambda: stats.export_reads),
        ReadCounter("graft_kv_transfer_export_expired_total",
                    "Held prompts freed unread after export_ttl_s.", lambda: stats.export_expired),
        ReadCounter("graft_kv_transfer_export_evicted_total",
                    "Held prompts freed unread after 2 s because this worker's own requests "
                    "needed their blocks.", lambda: stats.export_evicted),
        ReadCounter("graft_kv_transfer_imported_tokens_total",
                    "Prompt tokens whose KV came from a prefill worker.",
                    lambda: stats.imported_tokens)]
    series += [ReadCounter("graft_kv_transfer_imports_total",
                           "Prompts that started from a prefill worker's KV, by transport.",
                           lambda t=t: stats.imports_by_transport.get(t, 0), {"transport": t})
               for t in ("nixl", "http")]
    series += [ReadCounter("graft_kv_transfer_failures_total",
                           "Transfers that failed (the decode worker prefilled), by reason.",
                           lambda r=r: stats.failure_reasons.get(r, 0), {"reason": r})
               for r in FAILURE_REASONS]
    return series


def answer_params(ctx, request_id: str) -> dict:
    """What the prefill worker's answer carries (vLLM NixlConnector's fields; graft's
    connector reads remote_host, remote_port and remote_request_id)."""
    config, (host, port) = ctx.kv_transfer, ctx.advertised_address
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": config.engine_id or f"{host}:{port}",
            "remote_block_ids": ctx.engine.kv_exports.block_ids(request_id),
            "remote_host": host, "remote_port": port, "remote_request_id": request_id,
            "tp_size": 1}


def start_nixl(ctx) -> None:
    """This worker's NIXL agent over its KV pool, when the transport may be NIXL and NIXL is
    here (transport auto without NIXL: HTTP, said once in the log)."""
    config = ctx.kv_transfer
    if config is None or config.transport == "http":
        return
    if nixl_module() is None:
        log.info("KV transfer: NIXL is not installed, so KV moves over HTTP")
        return
    from graft.serving.engine.kv_nixl import NixlAgent

    ctx.nixl = ctx.engine.kv_exports.nixl = NixlAgent(ctx.engine.runner)


def export_meta(ctx, request_id: str) -> dict | None:
    """What a decode worker reads before it takes a held prompt's KV (any thread)."""
    export = ctx.engine.kv_exports.held.get(request_id)
    if export is None:
        return None
    from graft.serving.engine.kv_transfer import kv_layout

    return {"token_ids": export.token_ids, "images": export.images,
            "block_ids": export.block_ids, "layout": kv_layout(ctx.engine.runner),
            "nixl": ctx.nixl.handshake() if ctx.nixl is not None else None}


async def pull(ctx, spec: PullSpec) -> KVPayload | NixlSource | None:
    """The prompt's KV from the prefill worker: a NixlSource the engine reads into its pool
    when both workers have NIXL and one block size, else the bytes over HTTP; None (counted,
    logged) when the pull fails, so the caller prefills the prompt itself."""
    import httpx

    stats = ctx.engine.kv_exports.stats
    headers = peer_headers(ctx.settings.api_keys)
    try:
        async with httpx.AsyncClient(timeout=ctx.kv_transfer.pull_timeout_s) as client:
            if ctx.nixl is not None:
                resp = await client.get(spec.url + "/meta", headers=headers)
                if resp.status_code != 200:
                    raise ValueError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                meta = resp.json()
                remote = meta.get("nixl")
                if remote is not None and remote["block_size"] == ctx.engine.runner.block_size:
                    return NixlSource(meta["layout"], meta["token_ids"],
                                      [tuple(im) for im in meta["images"]], remote,
                                      meta["block_ids"], spec.request_id, ctx.nixl)
            resp = await client.get(spec.url, headers=headers)
        if resp.status_code != 200:
            raise ValueError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        return await asyncio.to_thread(decode_payload, resp.content)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
        stats.failed("pull")
        log.warning("KV pull from %s failed (%s): prefilling request %s here", spec.url, err,
                    spec.request_id)
        return None
