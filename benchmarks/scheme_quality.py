"""`graft bench scheme-quality` (or `python -m graft.benchmarks.scheme_quality`): what each
weight scheme, applied to every linear of an LLM, changes against the fp32 model: greedy
answers identical to fp32's, the tokens they share before the first difference, and the mean
and largest per-position KL(fp32 || scheme) of next-token distributions over the prompt and
fp32's answer (teacher-forced). One engine, the schemes swapped in place (graft quantize's
QuantEngine), so every number comes from the engine's own kernels. Writes JSON.

Why: the -a8 schemes round activations, which the dequantized-weight parity contract does not
cover; this is the measurement behind choosing them (docs/quantization.md). A scheme's speed is
`graft bench engine --quantization`'s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graft.benchmarks.cli_args import out_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a plain HF LLM dir (e.g. ~/.cache/graft/smollm2-135m-instruct)")
    parser.add_argument("--schemes", default="int8,int4-g32,int4-g32-a8",
                        help="weight schemes to compare with fp32, comma-separated")
    parser.add_argument("--prompts", default=None,
                        help="a .jsonl of {\"question\"} lines, sent as user messages (default: the "
                             "quickstart's 28 text prompts)")
    parser.add_argument("--max-tokens", type=int, default=32, help="greedy answer length")
    parser.add_argument("--out", type=out_file, default=None,
                        help="write the JSON result here (an existing file is replaced)")


def _prompts(path: str | None) -> list[str]:
    from graft.errors import GraftConfigError
    from graft.loads import json_loads

    if path is None:
        from graft.quickstart.data import TEXT_PROMPTS

        return list(TEXT_PROMPTS)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise GraftConfigError(f"--prompts {path}: not readable ({err})") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = json_loads(line, f"--prompts {path}:{n}")
        if not isinstance(record, dict) or "question" not in record:
            raise GraftConfigError(f"--prompts {path}:{n}: need a JSON object with \"question\"")
        out.append(str(record["question"]))
    if not out:
        raise GraftConfigError(f"--prompts {path}: no prompts")
    return out


def _kl(ref_logits, logits) -> tuple[float, float]:
    """(mean, max) over positions of KL(ref || other) of next-token distributions."""
    import torch

    ref, other = torch.log_softmax(ref_logits.double(), -1), torch.log_softmax(logits.double(), -1)
    per_position = (ref.exp() * (ref - other)).sum(-1).clamp(min=0.0)
    return float(per_position.mean()), float(per_position.max())


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run(args: argparse.Namespace) -> int:
    from graft.errors import GraftConfigError
    from graft.kernels.quant_formats import QuantScheme, QuantSchemeError
    from graft.quantize.engine import QuantEngine
    from graft.serving import SamplingParams
    from graft.serving.models.quant_config import FP32

    try:
        schemes = [QuantScheme.parse(s, "--schemes") for s in args.schemes.split(",") if s.strip()]
    except QuantSchemeError as err:
        raise GraftConfigError(str(err)) from None
    prompts = _prompts(args.prompts)
    qe = QuantEngine(args.model)
    for scheme in schemes:  # a one-line error before any is measured
        for name, (out_features, in_features) in qe.shapes.items():
            try:
                scheme.check_shape(out_features, in_features, where=name)
            except QuantSchemeError as err:
                raise GraftConfigError(f"--schemes {scheme.name}: {err}") from None
    tok = qe.engine.tokenizer
    ids = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False) for q in prompts]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    def answers(scheme):
        qe.apply({name: scheme for name in qe.shapes})
        return [o.token_ids for o in qe.engine.generate(prompt_token_ids=ids, sampling_params=greedy)]

    def logits(scheme, after):  # teacher-forced: every prompt followed by fp32's answer
        qe.apply({name: scheme for name in qe.shapes})
        return [qe.prefill_logits(p + a) for p, a in zip(ids, after)]

    reference = answers(FP32)
    ref_logits = logits(FP32, reference)
    print(f"{len(ids)} prompts, {args.max_tokens} greedy tokens; KL(fp32 || scheme) per position "
          "over prompt + fp32's answer")
    print(f"  {'scheme':12s} {'identical':>9s} {'shared tokens':>13s} {'mean KL':>9s} {'max KL':>8s}")
    results = []
    for scheme in schemes:
        got = answers(scheme)
        kls = [_kl(r, x) for r, x in zip(ref_logits, logits(scheme, reference))]
        r = {"scheme": scheme.name,
             "identical": sum(a == b for a, b in zip(got, reference)) / len(ids),
             "shared_tokens_mean": sum(_common(a, b) for a, b in zip(got, reference)) / len(ids),
             "kl_mean": sum(k[0] for k in kls) / len(kls), "kl_max": max(k[1] for k in kls)}
        results.append(r)
        print(f"  {r['scheme']:12s} {r['identical']:9.3f} {r['shared_tokens_mean']:13.1f} "
              f"{r['kl_mean']:9.2e} {r['kl_max']:8.2e}")
    if args.out:
        from graft.io import atomic_write_json

        atomic_write_json(args.out, {"model": str(args.model), "prompts": len(ids),
                                     "max_tokens": args.max_tokens, "results": results})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":  # the CLI's parser and its one-line config errors
    from graft.cli import main

    sys.exit(main(["bench", "scheme-quality", *sys.argv[1:]]))
