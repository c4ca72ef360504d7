"""`graft bench engine MODEL_DIR`: graft engine vs HF `generate` on one seeded workload
(`--quantization a,b,...`: the weight formats instead, graft.benchmarks.formats;
`--speculative ngram`: with vs without speculative decoding, graft.benchmarks.speculative).

Reports output tokens/s of both (same checkpoint, same process), the ratio, and the
engine's achieved FLOP/s as a fraction of a matmul roofline measured here on the model's
own weight shapes (the faster of torch's F.linear and oneDNN-prepacked weights). Writes JSON.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from graft.benchmarks.cli_args import check_min_max, out_file, positive_int
from graft.io import atomic_write_json
from graft.serving.engine.engine_args import add_engine_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", help="HF LLM directory (config.json + safetensors) or GGUF file")
    parser.add_argument("--num-requests", type=positive_int, default=64)
    parser.add_argument("--concurrency", type=positive_int, default=32,
                        help="engine max_num_seqs and HF batch size")
    parser.add_argument("--input-len", type=positive_int, nargs=2, default=(32, 512),
                        metavar=("MIN", "MAX"), help="prompt tokens, at most the model's context")
    parser.add_argument("--output-len", type=positive_int, nargs=2, default=(16, 256),
                        metavar=("MIN", "MAX"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads for both engine and HF (default: torch's)")
    parser.add_argument("--skip-hf", action="store_true", help="measure the engine only")
    parser.add_argument("--quantization", default=None, metavar="none,default,fp32,bf16,int8,int4",
                        help="instead of the workload: batch-1/batch-32 decode and prefill-512 "
                        "tok/s of each weight format (or quant.json; none: no quantization "
                        "config; default: what graft serve picks, for a GGUF its blocks as they "
                        "are) vs the memory roofline measured in the same run")
    parser.add_argument("--speculative", default=None, choices=["ngram", "suffix"],
                        help="instead of the workload: decode tok/s with and without "
                        "speculative decoding, copy-heavy and open chats, batch 1 and 8")
    parser.add_argument("--context", type=positive_int, default=32,
                        help="with --quantization: prompt tokens of the batch-1 decode run (a long "
                        "chat or an image prompt: decode attention reads that many cached tokens)")
    parser.add_argument("--decode-tokens", type=positive_int, default=64,
                        help="with --quantization/--speculative: tokens decoded per request")
    parser.add_argument("--batch", type=positive_int, default=32,
                        help="with --quantization: sequences of the batched decode run")
    parser.add_argument("--prefill-len", type=positive_int, default=512,
                        help="with --quantization: prompt tokens of the prefill run")
    parser.add_argument("--bandwidth-mb", type=positive_int, default=1024,
                        help="with --quantization: buffer read to measure memory bandwidth")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")
    # every engine measured (HF too: --dtype, --device); --concurrency is max_num_seqs, and
    # --quantization / --speculative above choose what is compared
    add_engine_args(parser, exclude=("max_num_seqs", "quantization", "speculative", "seed"))


def workload(n: int, input_len, output_len, vocab: int, seed: int):
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        p_len = rng.randint(*input_len)
        reqs.append(([rng.randrange(3, vocab) for _ in range(p_len)], rng.randint(*output_len)))
    return reqs


def run(args) -> int:
    import torch

    from graft.errors import GraftConfigError
    from graft.gguf_llm import model_path
    from graft.serving import Engine, EngineConfig, SamplingParams

    check_min_max("--input-len", args.input_len)
    check_min_max("--output-len", args.output_len)
    args.model_dir = str(model_path(args.model_dir))  # a GGUF file: its LLM dir
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.speculative:
        from graft.benchmarks.speculative import print_speculative, run_speculative

        result = run_speculative(args)
        print_speculative(result)
        if args.out:
            atomic_write_json(Path(args.out), result)
        return 0
    if args.quantization:
        from graft.benchmarks.formats import print_formats, run_formats

        result = run_formats(args, [s for s in args.quantization.split(",") if s])
        print_formats(result)
        if args.out:
            atomic_write_json(Path(args.out), result)
        return 0
    config = EngineConfig.from_args(args, max_num_seqs=args.concurrency)
    engine = Engine.from_pretrained(args.model_dir, config)
    if args.input_len[1] > engine.max_model_len:  # such prompts are refused: nothing measured
        raise GraftConfigError(f"--input-len {args.input_len[0]} {args.input_len[1]}: MAX is above "
                               f"this model's context ({engine.max_model_len} tokens); use "
                               f"MAX <= {engine.max_model_len}")
    reqs = workload(args.num_requests, args.input_len, args.output_len, engine.runner.vocab_size,
                    args.seed)
    shapes = _matmul_shapes(engine)
    result = {"model_dir": str(args.model_dir), "num_requests": args.num_requests,
              "concurrency": args.concurrency, "input_len": list(args.input_len),
              "output_len": list(args.output_len), "seed": args.seed, "dtype": args.dtype,
              "device": args.device, "torch_threads": torch.get_num_threads(),
              "num_kv_blocks": engine.block_manager.num_blocks,
              "kv_cache_dtype": str(engine.runner.kv_cache.dtype).removeprefix("torch."),
              "kernels_backend": _backend(engine),
              "cuda_graphs": engine.runner.decode_graphs is not None,
              # C kernel or torch per (format, in x out, rows bucket): None without C-layout linears
              "linear_dispatch": engine.runner.linear_paths}
    # warm-up outside the timed region: first-call allocations, and on a GPU the Triton
    # compiles of batched prefill/decode variants (seen: they cost seconds inside the timing)
    engine.generate(prompt_token_ids=[p[:n] for (p, _), n in zip(reqs[:3], (32, 17, 200))],
                    sampling_params=SamplingParams(temperature=0.0, max_tokens=4))
    result["engine"] = _run_engine(engine, reqs, shapes)
    roof = {m: _matmul_flops_per_s(shapes, m, engine.runner.dtype, engine.runner.device)
            for m in (args.concurrency, 512)}
    result["roofline_flops_per_s"] = {f"m{m}": v for m, v in roof.items()}
    e = result["engine"]
    result["engine_roofline_fraction"] = e["flops_per_s"] / roof[512]
    if e["decode_flops_per_s"]:
        result["decode_roofline_fraction"] = e["decode_flops_per_s"] / roof[args.concurrency]
    if not args.skip_hf:
        del engine  # give HF the memory
        result["hf"] = _run_hf(args.model_dir, reqs, args.concurrency, args.dtype, args.device)
        result["throughput_ratio"] = e["output_tokens_per_s"] / result["hf"]["output_tokens_per_s"]
    _print(result)
    if args.out:
        atomic_write_json(Path(args.out), result)
    return 0


def _backend(engine) -> str:
    from graft.kernels import backend_name

    return backend_name(engine.runner.kv_cache)


def _matmul_shapes(engine) -> dict:
    """Matmul shapes (out, in) of the last layer (of a sparse one: attention, one routed expert
    and the shared experts), multiply-adds per token over all layers (a sparse layer counts its
    router and top-k experts: active parameters), the lm head, and attention sizes."""
    m = engine.runner.model
    macs = 0
    for layer in m.layers:
        mlp = layer.mlp
        mats = [layer.self_attn.qkv_proj, layer.self_attn.o_proj]
        experts = getattr(mlp, "experts", None)
        if experts is None:
            mats += [mlp.gate_up_proj, mlp.down_proj]
        else:
            mats += [experts[0].gate_up_proj, experts[0].down_proj]
            macs += mlp.gate.weight.numel() + (mlp.gate.top_k - 1) * sum(
                lin.out_features * lin.in_features for lin in mats[2:])
            if mlp.shared_experts is not None:
                mats += [mlp.shared_experts.gate_up_proj, mlp.shared_experts.down_proj]
        per_layer = [(lin.out_features, lin.in_features) for lin in mats]
        macs += sum(o * i for o, i in per_layer)
    return {"layer": per_layer, "macs_per_token": macs, "num_layers": len(m.layers),
            "lm_head": tuple(m.output_weight.shape), "q_dim": m.layers[0].self_attn.q_size}


def _step_flops(shapes: dict, chunks: list[tuple[int, int]], num_logits: int) -> float:
    """FLOPs of one forward: chunks are (tokens already cached, new tokens) per sequence."""
    tokens = sum(n for _, n in chunks)
    lin = shapes["macs_per_token"]
    # QK^T and PV: 2 matmuls x 2 flops x q_dim per (query, key) pair, causal within a chunk
    pairs = sum(n * start + n * (n + 1) // 2 for start, n in chunks)
    attn = 4 * shapes["q_dim"] * pairs * shapes["num_layers"]
    head = shapes["lm_head"][0] * shapes["lm_head"][1]
    return 2.0 * tokens * lin + attn + 2.0 * num_logits * head


def _run_engine(engine, reqs, shapes) -> dict:
    import torch

    from graft.serving import SamplingParams

    steps = []
    execute = engine.runner.execute

    def timed(batch):
        chunks = [(s.num_computed_tokens, n) for s, n in zip(batch.seqs, batch.num_tokens)]
        logits_rows = sum(1 for s, n in zip(batch.seqs, batch.num_tokens)
                          if s.num_computed_tokens + n == len(s))
        t0 = time.perf_counter()
        out = execute(batch)
        if out[0].is_cuda:  # graph replays and launches are asynchronous
            torch.cuda.synchronize(out[0].device)
        steps.append((time.perf_counter() - t0, _step_flops(shapes, chunks, logits_rows),
                      batch.num_decodes == len(batch.seqs), len(batch.seqs)))
        return out

    engine.runner.execute = timed
    try:
        t0 = time.perf_counter()
        outs = engine.generate(prompt_token_ids=[p for p, _ in reqs], sampling_params=[
            SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in reqs])
        wall = time.perf_counter() - t0
    finally:
        engine.runner.execute = execute
    out_tokens = sum(len(o.token_ids) for o in outs)
    flops = sum(f for _, f, _, _ in steps)
    big = max(n for *_, n in steps)
    decode = [(t, f) for t, f, dec, n in steps if dec and n == big]
    dec_t = sum(t for t, _ in decode)
    return {"seconds": wall, "output_tokens": out_tokens, "output_tokens_per_s": out_tokens / wall,
            "steps": len(steps), "forward_seconds": sum(t for t, *_ in steps),
            "flops": flops, "flops_per_s": flops / wall,
            "decode_batch": big, "decode_steps_at_batch": len(decode),
            "decode_step_seconds": dec_t / len(decode) if decode else None,
            "decode_flops_per_s": sum(f for _, f in decode) / dec_t if dec_t else None,
            "num_preemptions": engine.scheduler.num_preemptions}


def _run_hf(model_dir, reqs, batch_size: int, dtype: str, device: str) -> dict:
    import torch

    from graft.model import load_llm

    model = load_llm(str(model_dir), dtype)[0].to(device)  # a GGUF-backed dir too
    model.eval()
    pad = model.generation_config.pad_token_id
    pad = 0 if pad is None else (pad[0] if isinstance(pad, list) else pad)
    useful, t0 = 0, time.perf_counter()
    for i in range(0, len(reqs), batch_size):
        chunk = reqs[i:i + batch_size]
        width = max(len(p) for p, _ in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (p, _) in enumerate(chunk):  # left padding
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        new = max(n for _, n in chunk)
        with torch.inference_mode():
            model.generate(ids.to(device), attention_mask=mask.to(device), do_sample=False,
                           max_new_tokens=new, min_new_tokens=new)
        useful += sum(n for _, n in chunk)  # tokens a caller asked for, not padding
    wall = time.perf_counter() - t0
    return {"seconds": wall, "output_tokens": useful, "output_tokens_per_s": useful / wall}


def _matmul_flops_per_s(shapes: dict, m: int, dtype, device, repeats: int = 3) -> float:
    """Best FLOP/s of x[m, in] @ W[out, in]^T over the model's layer and head shapes, with the
    faster of torch's F.linear and (on CPU) oneDNN-prepacked weights, the engine's CPU path."""
    import torch

    from graft.kernels import cpu_linear

    mats = [torch.randn(o, i, dtype=dtype, device=device) for o, i in shapes["layer"]]
    mats.append(torch.randn(*shapes["lm_head"], dtype=dtype, device=device))
    xs = [torch.randn(m, w.shape[1], dtype=dtype, device=device) for w in mats]
    flops = 2.0 * m * sum(w.numel() for w in mats)
    impls = [[(torch.nn.functional.linear, w) for w in mats]]
    if device.type == "cpu" and cpu_linear.unavailable_reason(dtype) is None:
        impls.append([(cpu_linear.packed_linear, cpu_linear.pack_weight(w)) for w in mats])
    best = float("inf")
    with torch.inference_mode():
        for calls in impls:
            for _ in range(repeats + 1):  # the first pass warms up
                t0 = time.perf_counter()
                for x, (fn, w) in zip(xs, calls):
                    fn(x, w)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                best = min(best, time.perf_counter() - t0)
    return flops / best


def _print(r: dict) -> None:
    e = r["engine"]
    print(f"engine: {e['output_tokens']} tokens in {e['seconds']:.1f}s = "
          f"{e['output_tokens_per_s']:.1f} tok/s, {e['flops_per_s'] / 1e9:.1f} GFLOP/s "
          f"({r['engine_roofline_fraction']:.0%} of matmul roofline at m=512)")
    if e["decode_flops_per_s"]:
        print(f"decode at batch {e['decode_batch']}: {e['decode_step_seconds'] * 1e3:.1f} ms/step, "
              f"{r['decode_roofline_fraction']:.0%} of matmul roofline at m={r['concurrency']}")
    if r["linear_dispatch"]:
        from graft.serving.models.linear_paths import describe

        print(f"C-layout linears: {describe(r['linear_dispatch'])}")
    if "hf" in r:
        h = r["hf"]
        print(f"hf generate: {h['output_tokens_per_s']:.1f} tok/s in {h['seconds']:.1f}s; "
              f"engine/hf = {r['throughput_ratio']:.2f}x")

