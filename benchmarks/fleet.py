"""`graft bench fleet MODEL`: two `graft serve` workers, one CPU and one thread each, behind
vllm-router (started by graft fleet's own launcher), under three workloads:

  prefix  G groups of C chats, each group sharing a system prompt of about T tokens, sent by
          N clients: prefix-cache hit rate (the workers' vllm:prefix_cache_* counters) and
          TTFT, per router policy (cache_aware, kv_aware, round_robin)
  images  an image-burst trace (`graft tune synth --profile image-burst`, a third of its
          images recurring): the share of the trace's images no worker had to encode (served
          by its own encoder cache or a peer's), per policy, against one worker alone on the
          same trace (needs a run dir)
  pd      long prompts arriving among streaming chats: the chats' TPOT p99 with a
          prefill/decode split (1 prefill + 1 decode worker), against one worker doing both
          roles and against two workers that each do both

Every run sends content no earlier run sent, so no run starts warm, and run k of every layout
sends the same content; each (workload, layout) gets a fresh fleet. Writes JSON (--out) and
prints min/median/max over --runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from graft.benchmarks.cli_args import out_file, positive

WORKLOADS = ("prefix", "images", "pd")
EXAMPLES = """examples:
  graft bench fleet ~/.cache/graft/smollm2-135m-instruct --workloads prefix,pd --runs 3
  graft bench fleet runs/quickstart --workloads images --out fleet.json"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an LLM dir or run dir (the images workload needs a run dir)")
    p.add_argument("--workloads", default="prefix,images,pd",
                   help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--policies", default="cache_aware,kv_aware,round_robin",
                   help="router policies for prefix and images")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--groups", type=int, default=4, help="prefix: groups of chats")
    p.add_argument("--chats", type=int, default=10, help="prefix: chats per group")
    p.add_argument("--system-tokens", type=int, default=830, help="prefix: shared prompt")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients")
    p.add_argument("--images", type=int, default=48, help="images: requests in the trace")
    p.add_argument("--long-tokens", type=int, default=1500, help="pd: long prompt tokens")
    p.add_argument("--router", default=None, help="vllm-router binary (as graft fleet)")
    p.add_argument("--out", type=out_file, default=None,
                   help="write the JSON report here (an existing file is replaced)")
    p.add_argument("--startup-timeout-s", type=positive, default=900.0)
    p.epilog = (p.epilog or "") + "\n\nOptions after -- go to every graft serve worker."


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    from graft.serving.http.fleet.fleet_cli import parse_args as fleet_parse_args

    return fleet_parse_args(parser, argv)


def run(args: argparse.Namespace) -> int:
    from graft.benchmarks.peers import machine_info
    from graft.benchmarks.report import emit
    from graft.errors import GraftConfigError
    from graft.serving.http.fleet.fleet_cli import find_router

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise GraftConfigError(f"--workloads {bad[0]!r}: use {', '.join(WORKLOADS)}")
    if "images" in workloads and not (Path(args.model) / "graft.yaml").is_file():
        raise GraftConfigError(f"--workloads images needs a run dir (graft.yaml); {args.model} "
                               "is an LLM dir: leave images out or pass a run dir")
    router = find_router(args.router)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    report = {"model": str(args.model), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "machine": machine_info(1), "runs": args.runs}
    logs = Path(tempfile.mkdtemp(prefix="graft-bench-fleet-"))
    # run k of every layout sends the same content (seed base + k), never sent before
    args.seed_base = time.time_ns() % (1 << 30)
    if "prefix" in workloads:
        report["prefix"] = {p: _runs(args, router, logs, prefix_run, policy=p) for p in policies}
    if "images" in workloads:
        alone = _runs(args, router, logs, images_run, policy="round_robin", replicas=1)
        report["images"] = {"one_worker": alone, **{
            p: _runs(args, router, logs, images_run, policy=p) for p in policies},
            # what the routers alone achieve: each worker's own cache only
            f"{policies[0]}_no_peers": _runs(args, router, logs, images_run,
                                             policy=policies[0], peers=False)}
    if "pd" in workloads:
        report["pd"] = {
            "one_worker": _runs(args, router, logs, pd_run, policy="round_robin", replicas=1),
            "both_roles": _runs(args, router, logs, pd_run, policy="round_robin"),
            "split": _runs(args, router, logs, pd_run, policy="round_robin", pd="1:1")}
    report["logs"] = str(logs)
    print(table(report))
    emit(report, args.out)
    return 0


def _runs(args, router: str, logs: Path, one_run, policy: str, replicas: int = 2,
          pd: str | None = None, peers: bool = True) -> dict:
    """`args.runs` runs of one workload on a fresh fleet; each run's numbers and their
    min/median/max."""
    from graft.serving.http.fleet.fleet_cli import Running, free_port_run, parse_cpus, plan

    base = free_port_run(replicas + 1)  # the router's port, then the workers'
    fleet_args = argparse.Namespace(
        path=args.model, replicas=replicas, pd=pd, policy=policy, host="127.0.0.1",
        encoder_cache_peers=peers,
        port=base, worker_port=base + 1, cpus=None, router=router,
        startup_timeout_s=args.startup_timeout_s,
        serve_args=["--served-model-name", "m", *args.serve_args])
    fleet = plan(fleet_args, parse_cpus(None), router)
    for w in fleet.workers:  # one thread each, whatever the CPU split gave
        w.env["OMP_NUM_THREADS"] = "1"
    name = (f"{one_run.__name__}-{policy}{'-pd' if pd else ''}"
            f"{'' if peers else '-nopeers'}-{replicas}")
    (logs / name).mkdir()
    runs = []
    with Running(fleet, args.startup_timeout_s, logs / name):
        time.sleep(1.0)  # the router's KV-event subscriptions connect in the background
        for k in range(args.runs):
            result = one_run(args, fleet, seed=args.seed_base + k)
            print(json.dumps({"workload": name, "run": k, **result}), flush=True)
            runs.append(result)
    return {"runs": runs, "summary": summarize_runs(runs)}


def summarize_runs(runs: list[dict]) -> dict:
    """min/median/max of every number the runs share."""
    out = {}
    for key in runs[0] if runs else []:
        values = sorted(r[key] for r in runs if isinstance(r.get(key), (int, float)))
        if values:
            out[key] = {"min": values[0], "median": values[len(values) // 2],
                        "max": values[-1]}
    return out


# --- the workloads ---------------------------------------------------------------------------
def prefix_run(args, fleet, seed: int) -> dict:
    from graft.benchmarks.report import percentiles

    before = [_scrape(w.url) for w in fleet.workers]
    systems = [_filler(fleet.workers[0].url, f"{seed}-{g}", args.system_tokens)
               for g in range(args.groups)]
    bodies = [_chat(systems[g], f"Question {c}: what does rule {c} ask of me?", 8)
              for c in range(args.chats) for g in range(args.groups)]  # the groups interleave
    results = asyncio.run(_send_all(fleet.router.url, bodies, args.clients))
    after = [_scrape(w.url) for w in fleet.workers]
    hits = _delta(before, after, "vllm:prefix_cache_hits_total")
    queries = _delta(before, after, "vllm:prefix_cache_queries_total")
    return {"hit_rate": hits / queries if queries else 0.0,
            "cached_share": sum(r.cached_tokens for r in results)
            / max(1, sum(r.prompt_tokens for r in results)),
            "ttft_p50_ms": percentiles([r.ttft for r in results if r.ttft])["p50"],
            "ttft_p99_ms": percentiles([r.ttft for r in results if r.ttft])["p99"],
            "failed": sum(not r.ok for r in results)}


def images_run(args, fleet, seed: int) -> dict:
    from graft.benchmarks.serve_trace import trace_workload
    from graft.tune.synth import synth_trace
    from graft.tune.trace import parse_record

    records = [parse_record(r, f"record {i}") for i, r in
               enumerate(synth_trace("image-burst", args.images, seed))]
    bodies = [body for _, body, _ in trace_workload(records, "m", seed=seed)]
    before = [_scrape(w.url) for w in fleet.workers]
    results = asyncio.run(_send_all(fleet.router.url, bodies, args.clients))
    after = [_scrape(w.url) for w in fleet.workers]
    # every miss is one image encoded; every other image of the trace came from a cache (this
    # worker's, or a peer's through --encoder-cache-peers)
    encoded = _delta(before, after, "graft_encoder_cache_misses")
    sent = sum(len(r.images) for r in records)
    return {"cache_served_share": 1.0 - encoded / sent if sent else 0.0,
            "images_sent": sent, "images_encoded": encoded,
            "peer_fetches": _delta(before, after, "graft_encoder_cache_peer_fetches_total"),
            "failed": sum(not r.ok for r in results)}


def pd_run(args, fleet, seed: int) -> dict:
    from graft.benchmarks.report import percentiles

    chats = [_chat(f"Chat {seed}-{i}.", "Tell me a long story about a river and a farmer.", 48)
             for i in range(3 * args.clients)]
    longs = [_chat(_filler(fleet.workers[0].url, f"{seed}-{i}", args.long_tokens),
                   "Summarize the rules above.", 8) for i in range(args.clients)]
    bodies = [b for pair in zip(chats[::3], chats[1::3], chats[2::3], longs) for b in pair]
    before = [_scrape(w.url) for w in fleet.workers]
    results = asyncio.run(_send_all(fleet.router.url, bodies, args.clients))
    after = [_scrape(w.url) for w in fleet.workers]
    chat_results = [r for r, b in zip(results, bodies) if b in chats]
    long_results = [r for r, b in zip(results, bodies) if b in longs]
    transferred = _delta(before, after, "graft_kv_transfer_imported_tokens_total")
    return {"chat_tpot_p99_ms": percentiles([r.tpot for r in chat_results if r.tpot])["p99"],
            "chat_tpot_p50_ms": percentiles([r.tpot for r in chat_results if r.tpot])["p50"],
            "long_ttft_p50_ms": percentiles([r.ttft for r in long_results if r.ttft])["p50"],
            "transferred_tokens": transferred, "failed": sum(not r.ok for r in results)}


# --- pieces --------------------------------------------------------------------------------
def _chat(system: str, question: str, max_tokens: int) -> dict:
    return {"model": "m", "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}


async def _send_all(url: str, bodies: list[dict], clients: int) -> list:
    """Every body sent by `clients` concurrent clients, in order; results in body order."""
    import httpx

    from graft.benchmarks.serve import send

    results: list = [None] * len(bodies)
    queue = iter(enumerate(bodies))
    async with httpx.AsyncClient(timeout=600) as client:
        async def worker():
            for i, body in queue:
                results[i] = await send(client, url, body, False)

        await asyncio.gather(*(worker() for _ in range(clients)))
    return results


def _filler(url: str, tag: str, tokens: int) -> str:
    """About `tokens` tokens of rules (counted by the worker's /tokenize), new for each tag."""
    import httpx

    words = [f"Rule {tag}.{i}: answer the user briefly and kindly." for i in range(tokens)]
    lo, hi = 1, len(words)
    while lo < hi:  # the most rules that stay within `tokens`
        mid = (lo + hi + 1) // 2
        r = httpx.post(url + "/tokenize", json={"prompt": " ".join(words[:mid])}, timeout=60)
        fits = r.status_code == 200 and r.json()["count"] <= tokens
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    return " ".join(words[:lo])


def _scrape(url: str) -> dict[str, float]:
    """A worker's /metrics: each series name with its values summed over labels."""
    import httpx

    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{")[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def _delta(before: list[dict], after: list[dict], name: str) -> float:
    return sum(a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before))


def table(report: dict) -> str:
    lines = [f"graft bench fleet: {report['model']} on {report['machine']['cpu_model']}, "
             f"{report['runs']} runs "
             "(min / median / max)"]
    for workload in WORKLOADS:
        for layout, res in (report.get(workload) or {}).items():
            for key, s in res["summary"].items():
                lines.append(f"  {workload:7s} {layout:12s} {key:22s} "
                             f"{s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f}")
    return "\n".join(lines)
