"""`graft serve PATH`: the OpenAI-compatible chat server for a run dir or a plain LLM dir;
`graft serve [LLM_DIR] --graft NAME=RUN_DIR ...`: several grafts over one shared LLM."""

from __future__ import annotations

import argparse
from pathlib import Path

from graft.cli_types import number_in
from graft.serving.engine.engine_args import add_engine_args
from graft.serving.http.fleet import kv_events_config
from graft.serving.http.openai.reasoning import FORMATS as REASONING_FORMATS
from graft.serving.http.openai.tool_calls import TOOL_CALL_PARSERS
from graft.serving.http.plumbing import stats_log
from graft.serving.http.serve_config import parse_args  # noqa: F401  (graft.cli's parse hook)


# value types: a bad number is an argparse error naming the flag and the range
_at_least_1 = number_in(int, low=1)
_count = number_in(int, low=0)
_positive_float = number_in(float, low=0.0, low_open=True)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's names

EXAMPLES = """examples:
  graft serve runs/quickstart                       # chat page at http://127.0.0.1:8000/
  graft serve ~/models/smollm2 --port 8001          # a bare LLM, text only
  graft serve ~/models/smollm2 --graft colors=runs/colors --graft digits=runs/digits
  graft serve --config serve.yaml --port 8002       # options from YAML; flags win over it
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, metavar="serve.yaml",
                   help="YAML file of options (keys: the flags' names, e.g. max_num_seqs: 32); "
                        "flags given on the command line win over it")
    p.add_argument("path", nargs="?", default=None,
                   help="run dir (graft.yaml: images + text), HF LLM dir or llama.cpp GGUF "
                        "file (text only); with --graft: optional, the LLM dir every graft "
                        "was trained on")
    p.add_argument("--graft", action="append", default=[], metavar="NAME=RUN_DIR",
                   help="serve this run dir as model NAME (repeat it: every graft shares one "
                        "LLM, KV pool and batch; the bare LLM stays listed, text only)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; on a loopback address without --api-key only Host "
                        "headers naming it are answered (DNS rebinding), see --allowed-host")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header names NAME (any port); repeat "
                        "for several; once given, only the listed names (and the loopback "
                        "names on a loopback bind) are answered")
    p.add_argument("--port", type=number_in(int, low=1, high=65535), default=8000,
                   help="checked free before the model loads")
    p.add_argument("--served-model-name", default=None,
                   help="model name clients send (default: the dir's name; with --graft: "
                        "the bare LLM's name)")
    p.add_argument("--allowed-local-media-path", default=None,
                   help="allow image_url file paths under this dir (default: none)")
    p.add_argument("--allow-remote-media", action="store_true",
                   help="allow http(s) image URLs (default: data: URLs only)")
    p.add_argument("--allowed-media-domains", nargs="+", default=[], metavar="DOMAIN",
                   help="with --allow-remote-media: fetch only from these hosts and their "
                        "subdomains (default: any public host)")
    p.add_argument("--remote-media-timeout-s", type=_positive_float, default=10.0,
                   help="deadline for all of a request's remote image fetches, redirects and "
                   "time queued for a fetch thread included")
    p.add_argument("--limit-images-per-prompt", type=_count, default=4,
                   help="most images in one request (more: 400)")
    p.add_argument("--max-image-bytes", type=_at_least_1, default=20 * 1024 * 1024,
                   help="largest encoded image accepted, in bytes (more: 413)")
    p.add_argument("--max-image-pixels", type=_at_least_1, default=4096 * 4096,
                   help="largest image accepted, width x height, checked from its header "
                   "before decoding (more: 413)")
    p.add_argument("--encoder-cache-mb", type=number_in(float, low=0.0), default=256.0,
                   help="byte budget of the encoder (image embedding) cache")
    p.add_argument("--encoder-cache-peers", nargs="+", default=[], metavar="URL",
                   help="other graft serve workers whose encoder caches this one asks before "
                        "encoding an image (graft fleet sets it); docs/fleet.md")
    p.add_argument("--encoder-tokens-per-step", type=_at_least_1, default=4096,
                   help="image tokens encoded between two engine steps")
    p.add_argument("--ttft-budget-ms", type=_positive_float, default=None,
                   help="default time-to-first-token budget; requests may set ttft_budget_ms")
    p.add_argument("--shrink-images-to-budget", action="store_true",
                   help="downscale native-resolution images (e.g. MoonViT) to meet a budget")
    p.add_argument("--admission-slack", type=_positive_float, default=1.0,
                   help="multiply TTFT estimates by this before comparing to the budget")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1 routes (repeat for several "
                        "keys; $GRAFT_API_KEY adds one more)")
    p.add_argument("--auth-health", action="store_true", help="/health needs a key too")
    p.add_argument("--auth-metrics", action="store_true", help="/metrics needs a key too")
    p.add_argument("--max-queued-requests", type=_count, default=None,
                   help="refuse (429 + Retry-After) when this many requests already wait for "
                        "their first token (default: no limit)")
    p.add_argument("--max-queued-tokens", type=_count, default=None,
                   help="refuse (429 + Retry-After) when the waiting requests' prompt tokens "
                        "would exceed this (default: no limit)")
    p.add_argument("--parse-special-tokens-in-text", action="store_true",
                   help="special-token text typed in messages (e.g. <|im_start|>) becomes "
                        "control tokens; default: plain text (trusted clients only)")
    p.add_argument("--pooling", default="last", choices=("last", "mean", "cls"),
                   help="how /v1/embeddings pools the prompt's final hidden states: last (the "
                        "last token: causal LLMs' choice and vLLM's default; default), mean, or "
                        "cls (the first token); llama.cpp's flag")
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                   help="where a request's unset sampling fields (temperature, top_p, top_k, "
                        "min_p, penalties, max_tokens) take their defaults: auto, the model's "
                        "generation_config.json; vllm, OpenAI's; or DIR's (vLLM's flag)")
    p.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                   help="a Jinja chat template, a file or the template's text, used instead of "
                        "the LLM tokenizer's own (vLLM's flag)")
    p.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_FORMATS),
                   help="a reasoning model's thinking (<think> ... </think>) goes to the "
                        "message's `reasoning`, not its `content` (vLLM's flag; default: off)")
    p.add_argument("--responses-store-mb", type=number_in(float, low=0.0), default=0.0,
                   metavar="MB",
                   help="keep the latest MB of /v1/responses answers (their JSON, with their "
                        "conversations) for previous_response_id and GET /v1/responses/{id}; "
                        "default 0: keep none, as vLLM")
    p.add_argument("--tool-call-parser", default="hermes", choices=sorted(TOOL_CALL_PARSERS),
                   help="how an answer's tool calls are written, under tool_choice auto: "
                        "hermes (<tool_call> blocks: Qwen2.5/3, Hermes; default) or llama3_json "
                        "(Llama 3.1-3.3's JSON calls); vLLM's flag")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted for vLLM's command lines: graft always reads tool calls "
                        "under tool_choice auto")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="append one JSON line per finished request (timings, token counts, "
                        "image sizes and hashes; graft tune replays it); rotated by size")
    p.add_argument("--trace-content", action="store_true",
                   help="with --trace: also the messages (text, images as data URLs)")
    p.add_argument("--trace-max-bytes", type=_at_least_1, default=64 << 20,
                   help="with --trace: rotate FILE to FILE.1 (FILE.2, ...) past this size")
    p.add_argument(kv_events_config.FLAG, type=kv_events_config.flag_type, default=None,
                   metavar="JSON",
                   help="publish KV cache events over ZMQ in vLLM's format, for routers that "
                        "route by each worker's prefix cache (vllm-router --policy kv_aware); "
                        "vLLM's fields, e.g. " + kv_events_config.EXAMPLE.replace("%", "%%")
                        + " (docs/fleet.md)")
    add_engine_args(p)  # --block-size, --dtype, --quantization, ...: every EngineConfig field
    p.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                   help="take part in a prefill/decode split (vLLM's flag), e.g. "
                        "'{\"kv_role\":\"kv_both\"}'; docs/fleet.md")
    p.add_argument("--log-level", default="warning", type=str.lower, choices=LOG_LEVELS,
                   help="uvicorn's log level (the stats line shows at any level)")
    stats_log.add_arguments(p)  # --log-interval, --log-format
    p.add_argument("--header-timeout-s", type=_positive_float, default=10.0,
                   help="close a connection whose request headers are not complete in this "
                        "time (408)")
    p.add_argument("--request-body-timeout-s", type=_positive_float, default=60.0,
                   help="answer 408 when a request body takes longer than this to arrive")
    p.add_argument("--request-timeout-s", type=_positive_float, default=600.0,
                   help="stop a request whose answer is not complete this long after it "
                        "arrived (408 request_timeout; a stream ends with that error event)")
    p.add_argument("--timeout-keep-alive", type=_count, default=5,
                   help="close idle kept-alive connections after this many seconds")
    p.add_argument("--limit-concurrency", type=_at_least_1, default=1024,
                   help="answer 503 beyond this many open connections / requests in flight")
    p.add_argument("--max-header-bytes", type=_at_least_1, default=16 * 1024,
                   help="largest request line + headers accepted")


def build(args: argparse.Namespace):
    """Engine + app from parsed arguments (also used by tests)."""
    from graft.serving.http.openai.sampling_defaults import model_sampling_defaults
    from graft.serving import EngineConfig
    from graft.serving import Engine
    from graft.serving.engine.config import engine_values
    from graft.serving.multimodal.media import MediaConfig
    from graft.serving.http.plumbing.request_guard import allowed_host_names
    from graft.serving.http.server import ServerSettings, build_app
    from graft.serving.http.fleet.pd import advertised_address, parse_kv_transfer_config
    from graft.gguf_llm import model_path

    keys = api_keys(args)  # a bad key is refused before minutes of loading
    template = chat_template_text(getattr(args, "chat_template", None))  # and a missing file
    source = getattr(args, "generation_config", "auto")
    # vllm or a folder of the user's: read (and checked) before loading; auto: after it
    defaults = None if source == "auto" else model_sampling_defaults(source)
    kv_transfer = (parse_kv_transfer_config(args.kv_transfer_config)
                   if getattr(args, "kv_transfer_config", None) else None)
    config = EngineConfig.for_serving(**engine_values(args))
    cache_bytes = int(args.encoder_cache_mb * 1024 * 1024)
    path = model_path(args.path) if args.path else None  # a .gguf file: its LLM dir
    if args.graft:
        engine = _graft_engine(args.graft, path, config, cache_bytes)
        path = engine.grafts.llm_path  # the base name defaults to the LLM dir's name
    elif path is None:
        from graft.errors import GraftConfigError

        raise GraftConfigError("graft serve needs PATH (a run dir or LLM dir) or at least one "
                               "--graft NAME=RUN_DIR")
    else:
        from graft.run_dir import model_dir_kind

        model_dir_kind(path, "PATH")  # neither kind: the error names PATH
        engine = Engine.from_pretrained(path, config, cache_bytes)
    if template is not None:
        use_chat_template(engine.tokenizer, template)  # one tokenizer: every graft's too
    media = MediaConfig(allowed_local_media_path=args.allowed_local_media_path,
                        allow_remote_media=args.allow_remote_media,
                        max_image_bytes=args.max_image_bytes,
                        max_image_pixels=args.max_image_pixels,
                        remote_timeout_s=args.remote_media_timeout_s,
                        remote_domains=tuple(args.allowed_media_domains))
    if defaults is None:  # auto: the LLM's own generation_config.json
        defaults = model_sampling_defaults(source, engine.model_dir)
    settings = ServerSettings(
        model_name=args.served_model_name or Path(args.path or path).resolve().name, media=media,
        sampling_defaults=defaults,
        limit_images_per_prompt=args.limit_images_per_prompt,
        default_ttft_budget_ms=args.ttft_budget_ms,
        encoder_tokens_per_step=args.encoder_tokens_per_step,
        admission_slack=args.admission_slack,
        shrink_images_to_budget=args.shrink_images_to_budget,
        parse_special_tokens_in_text=args.parse_special_tokens_in_text,
        reasoning_parser=args.reasoning_parser, tool_call_parser=args.tool_call_parser,
        pooling=args.pooling, responses_store_bytes=int(args.responses_store_mb * (1 << 20)),
        api_keys=keys, allowed_hosts=allowed_host_names(args.host, keys, args.allowed_host),
        auth_health=args.auth_health, auth_metrics=args.auth_metrics,
        max_queued_requests=args.max_queued_requests, max_queued_tokens=args.max_queued_tokens,
        request_body_timeout_s=args.request_body_timeout_s,
        request_timeout_s=args.request_timeout_s, max_header_bytes=args.max_header_bytes,
        kv_transfer=kv_transfer, advertised_address=advertised_address(args, kv_transfer),
        encoder_cache_peers=tuple(getattr(args, "encoder_cache_peers", None) or ()))
    app = build_app(engine, settings)
    app.state.kv_events = _kv_event_publisher(engine, getattr(args, "kv_events_config", None))
    if args.trace:
        from graft.serving.http.plumbing.trace_log import TraceWriter

        app.state.ctx.worker.tracer = TraceWriter(args.trace, args.trace_content,
                                                  args.trace_max_bytes)
    return app


def chat_template_text(value: str | None) -> str | None:
    """--chat-template's Jinja text: the file's, or the value itself when it is template text
    (vLLM takes either); GraftConfigError for a file that is not there or not text."""
    from graft.errors import GraftConfigError

    if value is None or any(c in value for c in "{}\n"):  # Jinja's marks: the text itself
        return value  # (never a path: a long template is past a file name's length limit)
    path = Path(value).expanduser()
    if not path.is_file():
        raise GraftConfigError(f"--chat-template {value}: no such file; give a Jinja template "
                               "file or the template's text")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise GraftConfigError(f"--chat-template {value}: cannot read it ({err})") from None


def use_chat_template(tokenizer, template: str) -> None:
    """Serve with `template`, rendered once here so a broken one stops the server in one line
    instead of failing every chat."""
    from graft.errors import GraftConfigError

    tokenizer.chat_template = template
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                      add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 - jinja2's syntax and runtime errors alike
        raise GraftConfigError(f"--chat-template: the template does not render a one-message "
                               f"chat: {type(err).__name__}: {' '.join(str(err).split())}"
                               ) from None


def _kv_event_publisher(engine, config):
    """The ZMQ publisher of the engine's KV events when --kv-events-config asks for one."""
    if config is None or not config.publishing:
        return None
    from graft.serving.http.fleet.kv_events import KVEventPublisher

    return KVEventPublisher(engine.block_manager.events, config, engine.config.block_size)


def api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """--api-key values plus $GRAFT_API_KEY (a key in the environment stays out of `ps`). An
    empty key is an error: it would otherwise leave the server open without a word."""
    import os

    from graft.errors import GraftConfigError

    env = os.environ.get("GRAFT_API_KEY")
    for where, key in [*(("--api-key", k) for k in args.api_key), ("$GRAFT_API_KEY", env)]:
        if key is not None and not key.strip():
            raise GraftConfigError(f"{where} is empty, which would serve without auth; give a "
                                   f"non-empty key, or leave {where} out to serve without one")
    return tuple(k for k in [*args.api_key, (env or "").strip()] if k)


def _graft_engine(specs: list[str], llm: Path | None, config, cache_bytes: int):
    from graft.errors import GraftConfigError
    from graft.run_dir import is_run_dir
    from graft.serving import Engine
    from graft.serving.multimodal.grafts import parse_graft_arg

    if llm is not None and is_run_dir(llm):
        raise GraftConfigError(f"PATH {llm} is a run dir; with --graft, pass it as "
                               f"--graft NAME={llm} and give PATH only for the shared LLM dir")
    grafts: dict[str, str] = {}
    for text in specs:
        name, run_dir = parse_graft_arg(text)
        if name in grafts:
            raise GraftConfigError(f"--graft {text!r}: the name {name!r} is used twice")
        grafts[name] = run_dir
    return Engine.from_grafts(grafts, config, llm=llm, cache_bytes=cache_bytes)


def uvicorn_options(args: argparse.Namespace) -> dict:
    """Connection limits for uvicorn.Config: header deadline, keep-alive, concurrency and
    header size (also used by tests)."""
    from graft.serving.http.plumbing.uvicorn_protocol import with_header_timeout

    return {"http": with_header_timeout(args.header_timeout_s),
            "timeout_keep_alive": args.timeout_keep_alive,
            "limit_concurrency": args.limit_concurrency,
            "h11_max_incomplete_event_size": args.max_header_bytes}


def run(args: argparse.Namespace) -> int:
    import uvicorn

    check_port_free(args.host, args.port)  # before minutes of loading, not after
    if args.trace:
        check_trace_path(args.trace)
    log_config = stats_log.configure(args.log_format, args.log_level)
    app = build(args)
    names = ", ".join(map(repr, app.state.ctx.models))
    stats_log.announce(f"graft serve: {args.path or 'grafts'} as {names} on "
                       f"http://{args.host}:{args.port}/v1 (chat page: "
                       f"http://{args.host}:{args.port}/)", args.log_format)
    defaults = app.state.ctx.settings.sampling_defaults
    if defaults:  # as vLLM says it: answers differ from OpenAI's defaults
        where = "the model's" if args.generation_config == "auto" else args.generation_config
        stats_log.announce(f"graft serve: requests that leave them unset sample with {where} "
                           f"generation_config.json: {defaults} (--generation-config vllm: "
                           "OpenAI's defaults)", args.log_format)
    with stats_log.periodic(app.state.ctx.metrics, args.log_interval):
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    **({"log_config": log_config} if log_config else {}), **uvicorn_options(args))
    if app.state.ctx.worker.tracer is not None:
        app.state.ctx.worker.tracer.close()  # the lines still queued
    if app.state.kv_events is not None:
        app.state.kv_events.shutdown()
    return 0


def check_trace_path(path: str) -> None:
    """GraftConfigError naming --trace when FILE cannot be written (a folder, no permission),
    so it fails at once instead of after the model has loaded."""
    from graft.errors import GraftConfigError
    from graft.io import OutputPathError, check_output_path

    try:
        check_output_path(path, "file")
    except OutputPathError as err:
        raise GraftConfigError(f"--trace: {err}") from None


def check_port_free(host: str, port: int) -> None:
    """GraftConfigError when `host:port` cannot be bound (in use, or not ours to bind).
    SO_REUSEADDR as uvicorn sets it, so a port in TIME_WAIT is not refused here."""
    import socket

    from graft.errors import GraftConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise GraftConfigError(f"--host {host}: cannot resolve it ({err.strerror})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as err:
            raise GraftConfigError(f"--port {port}: cannot listen on {host}:{port} "
                                   f"({err.strerror}); stop what uses it or pick another "
                                   "--port") from None
