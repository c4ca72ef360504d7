"""`graft bench engine MODEL --speculative ngram`: decode tok/s with and without speculative
decoding in one process, one engine (the request-level override switches it), on a
copy-heavy chat workload (repeat / correct a given text) and a non-copying one (open
questions), at batch 1 and batch 8. Greedy, so both runs must emit the same tokens (checked).
The machine may be shared: off and on alternate REPEATS times and each keeps its fastest run,
and tok/s is reported per wall second and per CPU second of this process (other processes'
load barely moves the second; with one torch thread it is the compute time).
"""

from __future__ import annotations

import time

REPEATS = 2

TEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank, while three small "
    "birds watch from the old oak tree and the farmer walks his cattle back to the barn.",
    "Invoice 4471: 12 boxes of blue ceramic tiles at 18.50 each, 3 tubes of grey grout at "
    "6.25 each, delivery to 14 Harbour Street on Tuesday morning between 8 and 10.",
    "To reset the router, unplug it for thirty seconds, plug it back in, wait until the "
    "green light stops blinking, then open the settings page and sign in again.",
    "Meeting notes: the budget review moves to Friday, Anna will send the updated slides, "
    "and the team agreed to ship the new search page before the end of the month.",
]
COPY_TASKS = ["Repeat the following text exactly, word for word:\n\n{}",
              "Fix any spelling mistakes in this text and return the full text:\n\n{}"]
OPEN_TASKS = ["Write a short poem about the sea.", "Explain why the sky is blue.",
              "Give three tips for learning a new language.", "Describe a busy market in spring.",
              "What makes a good friend?", "Tell a short story about a lost key.",
              "Why do people enjoy music?", "Describe your ideal weekend."]


def workloads(tokenizer) -> dict[str, list[list[int]]]:
    from graft.template import encode_chat

    def ids(text: str) -> list[int]:
        return encode_chat(tokenizer, [{"role": "user", "content": text}], [],
                           add_generation_prompt=True).input_ids

    return {"copy": [ids(task.format(t)) for task in COPY_TASKS for t in TEXTS],
            "open": [ids(q) for q in OPEN_TASKS]}


def _generate(engine, prompts, batch: int, max_tokens: int, mode: str):
    """(output token lists, wall seconds, CPU seconds) running `prompts` `batch` at a time."""
    from graft.serving import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, speculative=mode)
    outs, t0, c0 = [], time.perf_counter(), time.process_time()
    for i in range(0, len(prompts), batch):
        outs += engine.generate(prompt_token_ids=prompts[i:i + batch], sampling_params=params)
    return [o.token_ids for o in outs], time.perf_counter() - t0, time.process_time() - c0


def run_speculative(args) -> dict:
    import os

    from graft.serving import Engine, EngineConfig

    engine = Engine.from_pretrained(args.model_dir, EngineConfig.from_args(
        args, max_num_seqs=8, speculative=args.speculative))
    loads = {"load_average_before": os.getloadavg()}
    result = {"model_dir": str(args.model_dir), "speculative": args.speculative,
              "num_speculative_tokens": args.num_speculative_tokens,
              "max_tokens": args.decode_tokens, "runs": []}
    _generate(engine, workloads(engine.tokenizer)["copy"][:2], 2, 8, "off")  # warm-up
    for name, prompts in workloads(engine.tokenizer).items():
        for batch in (1, 8):
            chosen = prompts[:4] if batch == 1 else prompts[:8]
            best = {"off": [float("inf")] * 2, "on": [float("inf")] * 2}  # [wall, cpu]
            before = (engine.spec.proposed, engine.spec.accepted, engine.spec.steps)
            outs = {}
            for _ in range(REPEATS):
                for key, mode in (("off", "off"), ("on", args.speculative)):
                    outs[key], wall, cpu = _generate(engine, chosen, batch, args.decode_tokens, mode)
                    best[key] = [min(best[key][0], wall), min(best[key][1], cpu)]
            off, on = outs["off"], outs["on"]
            proposed, accepted, steps = (now - b for now, b in zip(
                (engine.spec.proposed, engine.spec.accepted, engine.spec.steps), before))
            n = sum(map(len, off))
            result["runs"].append({
                "workload": name, "batch": batch, "requests": len(chosen), "output_tokens": n,
                "tok_s_off": n / best["off"][0], "tok_s_on": n / best["on"][0],
                "speedup": best["off"][0] / best["on"][0],
                "cpu_tok_s_off": n / best["off"][1], "cpu_tok_s_on": n / best["on"][1],
                "cpu_speedup": best["off"][1] / best["on"][1],
                "identical_tokens": on == off,
                "acceptance_rate": accepted / proposed if proposed else 0.0,
                "mean_accepted_length": (accepted + steps) / steps if steps else 0.0})
    loads["load_average_after"] = os.getloadavg()
    result.update(loads)
    return result


def print_speculative(result: dict) -> None:
    print(f"speculative={result['speculative']} k={result['num_speculative_tokens']} "
          f"(load average before {result['load_average_before'][0]:.2f}, "
          f"after {result['load_average_after'][0]:.2f})")
    for r in result["runs"]:
        print(f"{r['workload']:>5} batch {r['batch']}: off {r['tok_s_off']:.1f} tok/s, "
              f"on {r['tok_s_on']:.1f} tok/s = {r['speedup']:.2f}x (per CPU second: "
              f"{r['cpu_tok_s_off']:.1f} -> {r['cpu_tok_s_on']:.1f} = {r['cpu_speedup']:.2f}x); "
              f"acceptance "
              f"{r['acceptance_rate']:.0%}, {r['mean_accepted_length']:.2f} tokens/verify step; "
              f"identical tokens: {r['identical_tokens']}")
