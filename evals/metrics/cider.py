"""CIDEr-D for captions, with a pure-Python tokenizer.

Deviation from the reference (pycocoevalcap): captions are tokenized by lowercasing and
keeping runs of letters/digits (apostrophes kept inside words), not by the Java PTB
tokenizer, so "don't" stays one token instead of "do n't". Scores can differ slightly
from published numbers on text with contractions or unusual punctuation.
Document frequencies come from the whole evaluated corpus; bootstrap CIs resample the
per-image scores without recomputing them.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

N_MAX = 4  # n-grams of length 1..4
SIGMA = 6.0  # width of the Gaussian length penalty
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def tokenize(text: str | None) -> list[str]:
    return _TOKEN.findall(str(text or "").lower())


def _ngrams(tokens: list[str]) -> Counter:
    counts = Counter()
    for n in range(1, N_MAX + 1):
        for i in range(len(tokens) - n + 1):
            counts[tuple(tokens[i:i + n])] += 1
    return counts


def _tfidf(counts: Counter, df: Counter, log_n_docs: float):
    """Per n: tf-idf vector, its norm, and the length used by the penalty."""
    vec = [dict() for _ in range(N_MAX)]
    norm = [0.0] * N_MAX
    length = 0
    for gram, tf in counts.items():
        n = len(gram) - 1
        weight = float(tf) * (log_n_docs - math.log(max(1.0, df[gram])))
        vec[n][gram] = weight
        norm[n] += weight * weight
        if n == 1:  # as the reference code does: the length is the number of bigrams
            length += tf
    return vec, [math.sqrt(x) for x in norm], length


def _similarity(hyp, ref) -> list[float]:
    (vh, nh, lh), (vr, nr, lr) = hyp, ref
    penalty = math.exp(-((lh - lr) ** 2) / (2 * SIGMA**2))
    out = []
    for n in range(N_MAX):
        # clipping the hypothesis weight at the reference weight is the "-D" part
        val = sum(min(w, vr[n].get(g, 0.0)) * vr[n].get(g, 0.0) for g, w in vh[n].items())
        if nh[n] != 0 and nr[n] != 0:
            val /= nh[n] * nr[n]
        out.append(val * penalty)
    return out


def cider_d(predictions: list[str | None], references: list[list[str]]) -> list[float]:
    """Per-image CIDEr-D (x10 scale); document frequencies come from this corpus's references."""
    ref_counts = [[_ngrams(tokenize(r)) for r in refs] for refs in references]
    df = Counter()
    for refs in ref_counts:
        for gram in set().union(*[set(c) for c in refs]) if refs else ():
            df[gram] += 1
    log_n = math.log(float(len(references))) if references else 0.0
    scores = []
    for pred, refs in zip(predictions, ref_counts):
        if pred is None or not refs:
            scores.append(0.0)
            continue
        hyp = _tfidf(_ngrams(tokenize(pred)), df, log_n)
        total = np.zeros(N_MAX)
        for ref in refs:
            total += np.array(_similarity(hyp, _tfidf(ref, df, log_n)))
        scores.append(float(total.mean() / len(refs) * 10.0))
    return scores


def cider_scores(predictions, samples) -> list[dict[str, float]]:
    refs = [[str(t) for t in s.target] if isinstance(s.target, (list, tuple)) else [str(s.target)] for s in samples]
    return [{"cider_d": v} for v in cider_d(list(predictions), refs)]


def cider_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    return {"cider_d": float(columns["cider_d"].mean())}
