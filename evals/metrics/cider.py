"""CIDEr-D for captions, as pycocoevalcap computes it, with a pure-Python PTB tokenizer.

Source: salaniz/pycocoevalcap 1.2 (commit ad63453), cider/cider_scorer.py (CiderScorer:
n = 1..4, sigma = 6, clipped tf-idf cosine, Gaussian length penalty on bigram counts, x10)
after tokenizer/ptbtokenizer.py, which ptb_tokenizer.py replaces without Java. The package
itself is not a dependency: its 104 MB wheel is mostly Java jars and it requires pycocotools
(a C extension); its scorer is reproduced here and tested against it (tests/evals/official).
Document frequencies come from the whole evaluated corpus; bootstrap CIs resample the
per-image scores without recomputing them.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from graft.evals.metrics.ptb_tokenizer import ptb_tokenize
from graft.evals.metrics.references import reference_list

DEFINITION = "salaniz/pycocoevalcap 1.2 cider/cider_scorer.py (CIDEr-D) @ ad63453, PTB tokens in Python"
N_MAX = 4  # n-grams of length 1..4
SIGMA = 6.0  # width of the Gaussian length penalty


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
    penalty = math.e ** (-(float(lh - lr) ** 2) / (2 * SIGMA**2))  # as the reference writes it
    out = []
    for n in range(N_MAX):
        # clipping the hypothesis weight at the reference weight is the "-D" part
        val = sum(min(w, vr[n].get(g, 0.0)) * vr[n].get(g, 0.0) for g, w in vh[n].items())
        if nh[n] != 0 and nr[n] != 0:
            val /= nh[n] * nr[n]
        out.append(val * penalty)
    return out


def cider_d(predictions: list[str | None], references: list[list[str]], tokenize=ptb_tokenize) -> list[float]:
    """Per-image CIDEr-D (x10 scale); document frequencies come from this corpus's references.

    `tokenize` maps a caption to its tokens (str.split for captions tokenized already).
    """
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
    refs = [reference_list(s, "cider_d") for s in samples]
    return [{"cider_d": v} for v in cider_d(list(predictions), refs)]


def cider_aggregate(columns: dict[str, np.ndarray], groups: np.ndarray) -> dict[str, float]:
    return {"cider_d": float(columns["cider_d"].mean())}
