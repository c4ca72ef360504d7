"""Calibration sequences and the KL divergence of a plan's next-token distributions from fp32's.

Sources: a run dir's own training data (LLaVA JSON with its images, whole conversations), or
a file: LLaVA `.json`; `.jsonl` with one {"text"} | {"messages"} | {"conversations", "image"}
per line; any other file as plain text, one sequence per blank-line-separated paragraph.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from graft.errors import GraftConfigError, GraftError
from graft.loads import json_loads
from graft.train.data import read_samples


@dataclass
class CalibrationSeq:
    ids: list[int]  # token ids; image placeholders negative
    rows: torch.Tensor | None  # [n_placeholders, d_model] image embeddings, in order


def load_calibration(qe, source: str | None, n_samples: int, max_tokens: int) -> list[CalibrationSeq]:
    """Up to n_samples sequences of at most max_tokens tokens; one-line error when none."""
    front = qe.engine.mm
    if source is None:
        if front is None:
            raise GraftConfigError("an LLM dir has no training data to calibrate on: pass "
                                   "--calibration FILE (text, .jsonl or LLaVA .json)")
        spec = front.spec
        from graft.spec import GraftSpec

        records = read_samples(Path(GraftSpec.expand(spec.data.train)))
        image_root, system = Path(GraftSpec.expand(spec.data.image_root)), spec.data.system_prompt
        where = f"the run's training data ({spec.data.train})"
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise GraftConfigError(f"--calibration {source}: no such file")
        records, image_root, system, where = _records(path), path.parent, None, f"--calibration {source}"
    seqs = []
    for label, record in records[:n_samples]:
        try:
            seq = _encode(qe, front, record, image_root, system, max_tokens)
        except GraftError as err:  # which record of which file, not only what is wrong with it
            raise GraftConfigError(f"{where} {label}: {err}") from err
        if seq is not None and len(seq.ids) > 1:
            seqs.append(seq)
    if not seqs:
        raise GraftConfigError(f"{where} holds no calibration text (need at least one sequence "
                               "of 2+ tokens); pass --calibration FILE with some")
    return seqs


def _records(path: Path) -> list[tuple[str, dict]]:
    """(where in the file, record) pairs: a .json's sample N, a .jsonl's line N, paragraph N."""
    if path.suffix == ".json":
        return read_samples(path)
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix == ".jsonl":
        out = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                out.append((f"line {lineno}", json_loads(line, f"--calibration {path}:{lineno}")))
        return out
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    return [(f"paragraph {i}", {"text": p}) for i, p in enumerate(paragraphs, 1)]


def _encode(qe, front, record, image_root: Path, system: str | None, max_tokens: int):
    from graft.template import encode_chat, llava_to_messages
    from graft.train.data import load_image, sample_image_paths

    if not isinstance(record, dict):
        return None
    tokenizer = qe.engine.tokenizer
    if "text" in record:
        return CalibrationSeq(tokenizer(str(record["text"]))["input_ids"][:max_tokens], None)
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise GraftConfigError("'messages' must be a list of {\"role\", \"content\"} objects")
        messages = list(messages)
    elif "conversations" in record:
        messages = llava_to_messages(record["conversations"], system)
    else:
        return None
    images = [load_image(p) for p in sample_image_paths(record, image_root)]
    if images and front is None:
        return None  # a plain LLM cannot see images: skip such lines
    counts = [front.image_path.image_token_count(*im.size) for im in images]
    ids = encode_chat(tokenizer, messages, counts).input_ids[:max_tokens]
    rows = None
    if images:
        with torch.no_grad():
            rows = torch.cat([r.float() for r in front.image_path.image_features(images)])
        rows = rows[:sum(1 for t in ids if t < 0)]  # a cut sequence keeps the rows it reaches
    return CalibrationSeq(ids, rows)


class KLMeter:
    """Mean per-position KL(fp32 || plan) of next-token distributions over the calibration set.
    The fp32 log-probabilities are computed once, under the fp32 plan."""

    def __init__(self, qe, seqs: list[CalibrationSeq], fp32_plan: dict):
        self.qe, self.seqs = qe, seqs
        qe.apply(fp32_plan)
        self.reference = [torch.log_softmax(qe.prefill_logits(s.ids, s.rows), -1) for s in seqs]

    def __call__(self, plan: dict) -> float:
        self.qe.apply(plan)
        total, count = 0.0, 0
        for seq, ref in zip(self.seqs, self.reference):
            logq = torch.log_softmax(self.qe.prefill_logits(seq.ids, seq.rows), -1)
            total += float((ref.exp() * (ref - logq)).sum())  # sum over positions and vocab
            count += ref.shape[0]
        return max(total / count, 0.0)  # float error can leave -1e-9 for identical weights
