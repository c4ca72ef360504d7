"""`python -m graft.benchmarks.grammar_compile URL --model NAME`: what JSON-schema compiles
cost a running `graft serve`. Per run: a request with a fresh heavy schema (cold: a compile
worker compiles it, the matcher is built), the same schema again (cached), a plain chat alone,
and the same plain chat while --background clients keep sending fresh wide schemas that a
compile worker compiles and refuses. Prints min/median/max in seconds as JSON. The heavy
schema: --properties required string properties (1500: about 95 KB, within every bound)."""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

CHAT = "/v1/chat/completions"


def wide_schema(n: int, tag: str) -> dict:
    """n optional properties: over 500 a compile worker refuses it (a parser row over
    llguidance's 2000 items) after compiling it, so it never reaches the engine."""
    return {"type": "object",
            "properties": {f"{tag}_{i}": {"type": "string"} for i in range(n)}}


def heavy_schema(n: int, tag: str) -> dict:
    names = [f"{tag}_{i}" for i in range(n)]
    return {"type": "object", "required": names, "additionalProperties": False,
            "properties": {name: {"type": "string", "maxLength": 4} for name in names}}


def _post(client, url: str, model: str, max_tokens: int, schema: dict | None = None,
          refused: bool = False) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "Describe a circle."}],
            "temperature": 0, "max_tokens": max_tokens}
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "form", "schema": schema}}
    start = time.perf_counter()
    resp = client.post(url + CHAT, json=body, timeout=600)
    if (resp.status_code == 400) != refused:
        raise SystemExit(f"unexpected answer {resp.status_code}: {resp.text[:300]}")
    return time.perf_counter() - start


def _spread(values: list[float]) -> dict:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def run(url: str, model: str, runs: int, properties: int, plain_tokens: int,
        background: int, wide: int) -> dict:
    import httpx

    out: dict[str, list[float]] = {"compile_cold_s": [], "compile_cached_s": [],
                                   "plain_alone_s": [], "plain_beside_compiles_s": []}
    with httpx.Client() as client:
        _post(client, url, model, plain_tokens)  # warm the path (and the grammar tokenizer)
        _post(client, url, model, 1, heavy_schema(8, "warm"))
        for _ in range(runs):
            schema = heavy_schema(properties, uuid.uuid4().hex[:8])
            out["compile_cold_s"].append(_post(client, url, model, 1, schema))
            out["compile_cached_s"].append(_post(client, url, model, 1, schema))
            out["plain_alone_s"].append(_post(client, url, model, plain_tokens))
            stop = threading.Event()

            def compile_forever() -> None:
                with httpx.Client() as other:
                    while not stop.is_set():
                        _post(other, url, model, 1, wide_schema(wide, uuid.uuid4().hex[:8]),
                              refused=True)

            threads = [threading.Thread(target=compile_forever) for _ in range(background)]
            for t in threads:
                t.start()
            time.sleep(0.2)  # the compiles are under way
            out["plain_beside_compiles_s"].append(_post(client, url, model, plain_tokens))
            stop.set()
            for t in threads:
                t.join()
    return {k: _spread(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    import json

    parser = argparse.ArgumentParser(prog="python -m graft.benchmarks.grammar_compile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="a running graft serve, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="a served model name (see /v1/models)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--properties", type=int, default=1500)
    parser.add_argument("--plain-tokens", type=int, default=32, help="max_tokens of the plain chat")
    parser.add_argument("--background", type=int, default=2,
                        help="clients sending fresh wide schemas during the plain chat")
    parser.add_argument("--wide", type=int, default=2000,
                        help="optional properties of their schemas (refused after compiling)")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.url.rstrip("/"), args.model, args.runs, args.properties,
                         args.plain_tokens, args.background, args.wide), indent=2))


if __name__ == "__main__":
    main()
