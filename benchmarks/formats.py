"""`graft bench engine MODEL --quantization fp32,bf16,int8,int4`: every weight format in one
process, each against the memory roofline measured in the same run.

Per format: batch-1 decode tok/s (what one chat stream feels; after a --context-token
prompt, 32 by default), batch-32 decode tok/s, prefill-512 tok/s (the median of 3 passes
after one at the same length), the linear-weight bytes
one decode step reads, and batch-1 decode as a fraction of its roofline (those bytes over
the read bandwidth measured just before and just after that format's batch-1 run: on a
shared machine it drifts). Whole engine steps are timed (scheduler, sampler and Python included), after a warm-up. Writes JSON. The name
`none` is the engine without a quantization config (fp32 on oneDNN-prepacked linears, op by
op); `fp32` is a quantization config of fp32 everywhere (the C linears, one call per decode
step); `default` is what `graft serve` picks for the model (a GGUF file: each weight in its
blocks' own scheme).
"""

from __future__ import annotations

import functools
import random
import statistics
import time

PREFILL_PASSES = 3  # prefill-512 is the median of this many passes, each a new prompt
DEFAULT = "default"  # the --quantization name of the engine's own choice (a GGUF: its blocks')


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best bytes/s of one pass over a cold fp32 buffer larger than the caches (torch's
    threads), on 2 MB pages like the engine's weights (on 4 KB pages this VM read ~1.5x
    slower: that would understate the roofline)."""
    buf = _bandwidth_buffer(nbytes)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


@functools.cache
def _bandwidth_buffer(nbytes: int):
    import torch

    from graft.kernels import huge_pages

    return huge_pages.empty(nbytes // 4 * 4).view(torch.float32).fill_(1.0)


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def _timed_steps(engine, prompts, max_tokens: int) -> list[tuple[float, int, bool]]:
    """(seconds, sequences in the step, every sequence decoding) per engine step."""
    from graft.serving import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}", prompt_token_ids=p, sampling_params=params)
    steps = []
    execute = engine.runner.execute

    def record(batch):
        record.last = (len(batch.seqs), batch.num_decodes == len(batch.seqs))
        return execute(batch)

    engine.runner.execute = record
    try:
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            steps.append((time.perf_counter() - t0, *record.last))
    finally:
        engine.runner.execute = execute
    return steps


def _decode_tokens_per_s(steps, batch: int) -> float | None:
    full = [t for t, n, dec in steps if dec and n == batch]
    return batch * len(full) / sum(full) if full else None


def measure_format(model_dir, scheme: str, args, seed: int = 0) -> dict:
    from graft.serving import Engine, EngineConfig
    from graft.serving.models.quant_config import scheme_counts

    config = EngineConfig.from_args(args, max_num_seqs=max(args.batch, args.concurrency),
                                    quantization=None if scheme == DEFAULT else scheme,
                                    max_num_batched_tokens=max(args.max_num_batched_tokens,
                                                               args.prefill_len))
    t0 = time.perf_counter()
    engine = Engine.from_pretrained(model_dir, config)
    load_s = time.perf_counter() - t0
    if args.context + args.decode_tokens >= engine.max_model_len:
        from graft.errors import GraftConfigError

        raise GraftConfigError(
            f"--context {args.context}: use 1 to {engine.max_model_len - args.decode_tokens - 1} "
            f"(max_model_len {engine.max_model_len} minus --decode-tokens)")
    vocab = engine.runner.vocab_size
    _timed_steps(engine, _prompts(2, 32, vocab, seed), 8)  # warm-up: first-call allocations
    # this machine's memory speed drifts by up to 2x within minutes (other tenants): the
    # roofline of the batch-1 run is the bandwidth read just before and just after it
    bw_before = read_bandwidth(args.bandwidth_mb << 20)
    one = _timed_steps(engine, _prompts(1, args.context, vocab, seed + 1), args.decode_tokens)
    bw = (bw_before + read_bandwidth(args.bandwidth_mb << 20)) / 2
    many = _timed_steps(engine, _prompts(args.batch, 64, vocab, seed + 2), args.decode_tokens // 2)
    prefill_len = min(args.prefill_len, engine.max_model_len - 1)
    # a warm-up pass at this length first (its first call builds buffers and library plans for
    # the shape), then the median of PREFILL_PASSES fresh prompts: one pass varied by 10%
    _timed_steps(engine, _prompts(1, prefill_len, vocab, seed + 3), 1)
    prefill = [_timed_steps(engine, _prompts(1, prefill_len, vocab, seed + 4 + i), 1)[0][0]
               for i in range(PREFILL_PASSES)]
    model = engine.runner.model
    return {"scheme": scheme, "load_seconds": load_s,
            "linear_dispatch": engine.runner.linear_paths,  # C kernel or torch per shape and rows
            "kv_cache_dtype": str(engine.runner.kv_cache.dtype).removeprefix("torch."),
            "linears": scheme_counts(engine.runner.quant_plan),
            "weight_bytes_per_decode_step": model.weight_bytes_per_token(),
            # MoE: a batch of 32 activates more experts than one token (the active-parameter roofline)
            "weight_bytes_per_batch32_step": (model.weight_bytes_per_token(args.batch)
                                              if hasattr(model, "moe_blocks") else None),
            "read_bandwidth_bytes_per_s": bw,
            "resident_bytes": sum(t.numel() * t.element_size() for t in model.resident_tensors()),
            "batch1_decode_tokens_per_s": _decode_tokens_per_s(one, 1),
            # the key names the default sizes; "batch" and "prefill_tokens" say what ran
            "batch": args.batch, "batch32_decode_tokens_per_s": _decode_tokens_per_s(many, args.batch),
            "prefill_tokens": prefill_len, "prefill_pass_seconds": prefill,
            "prefill512_tokens_per_s": prefill_len / statistics.median(prefill)}


def run_formats(args, schemes: list[str]) -> dict:
    import gc

    import torch

    result = {"model_dir": str(args.model_dir), "dtype": args.dtype, "device": args.device,
              "torch_threads": torch.get_num_threads(), "decode_tokens": args.decode_tokens,
              "batch1_context": args.context,
              "formats": {}}
    for scheme in schemes:
        result["formats"][scheme] = measure_format(args.model_dir, scheme, args)
        gc.collect()
    result["read_bandwidth_bytes_per_s"] = max(f["read_bandwidth_bytes_per_s"]
                                               for f in result["formats"].values())
    base = result["formats"].get("none") or result["formats"].get("fp32")
    for f in result["formats"].values():
        roof = f["read_bandwidth_bytes_per_s"] / f["weight_bytes_per_decode_step"]
        f["batch1_roofline_tokens_per_s"] = roof
        f["batch1_roofline_fraction"] = f["batch1_decode_tokens_per_s"] / roof
        if f["weight_bytes_per_batch32_step"]:
            f["batch32_roofline_tokens_per_s"] = (f["batch"] * f["read_bandwidth_bytes_per_s"]
                                                  / f["weight_bytes_per_batch32_step"])
        if base:
            for key in ("batch1_decode_tokens_per_s", "batch32_decode_tokens_per_s", "prefill512_tokens_per_s"):
                f[key.replace("_tokens_per_s", "_vs_base")] = f[key] / base[key]
    return result


def print_formats(r: dict) -> None:
    print(f"{r['torch_threads']} threads; roofline: the read bandwidth around each batch-1 run")
    print(f"{'format':>10} {'MB/step':>8} {'GB/s':>6} {'b1 tok/s':>9} {'roofline':>9} {'b32 tok/s':>10} {'prefill512':>11}")
    for name, f in r["formats"].items():
        print(f"{name:>10} {f['weight_bytes_per_decode_step'] / 1e6:8.1f} "
              f"{f['read_bandwidth_bytes_per_s'] / 1e9:6.1f} "
              f"{f['batch1_decode_tokens_per_s']:9.1f} {f['batch1_roofline_fraction']:8.0%} "
              f"{f['batch32_decode_tokens_per_s']:10.1f} {f['prefill512_tokens_per_s']:11.1f}")
