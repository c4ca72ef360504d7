"""graft's metrics against scores the official evaluators produced (tests/evals/official).

official_cases.json was written by tests/evals/official/make_official_cases.py, which runs
GT-Vision-Lab's vqaEval.py, lmms-eval, POPE's evaluate.py, VLMEvalKit's matching code and
pycocoevalcap (with its Java PTB tokenizer) on the inputs in official_inputs.py.
"""

import json
from pathlib import Path

import pytest

from graft.evals.dataset import Sample
from graft.evals.metrics import METRICS
from graft.evals.metrics.anls import anls_score
from graft.evals.metrics.cider import cider_d
from graft.evals.metrics.multiple_choice import extract_choice
from graft.evals.metrics.ptb_tokenizer import ptb_tokenize
from graft.evals.metrics.vqa import vqa_soft_accuracy
from graft.evals.metrics.yes_no import parse_yes_no
from graft.evals.stats import columns_of, group_index

CASES = json.loads((Path(__file__).parent / "official" / "official_cases.json").read_text())
# captions the Python tokenizer splits unlike CoreNLP (documented in docs/evals.md)
PTB_KNOWN_DIFFERENCES = {"A man's 2nd-floor apartment (with a view!) costs $1,200/month.",  # 1,200 / month
                         "It's 5 o'clock -- time for tea & cake :)",  # the emoticon :-rrb-
                         "C++ and C# code on a screen"}

def _ids(cases, key):
    return [repr(c[key])[:40] for c in cases]


@pytest.mark.parametrize("definition", ["gt-vision-lab", "lmms-eval"])
@pytest.mark.parametrize("case", CASES["vqa"], ids=_ids(CASES["vqa"], "prediction"))
def test_vqa_matches_official(case, definition):
    assert vqa_soft_accuracy(case["prediction"], case["answers"], definition) == case[definition]


@pytest.mark.parametrize("case", CASES["anls"], ids=_ids(CASES["anls"], "prediction"))
def test_anls_matches_lmms_eval(case):
    assert anls_score(case["prediction"], case["answers"]) == case["anls"]


@pytest.mark.parametrize("case", CASES["pope_answers"], ids=_ids(CASES["pope_answers"], "prediction"))
def test_pope_reading_matches_evaluate_py(case):
    assert parse_yes_no(case["prediction"]) is case["yes"]


@pytest.mark.parametrize("case", CASES["pope_answers"], ids=_ids(CASES["pope_answers"], "prediction"))
def test_pope_reading_matches_lmms_eval(case):
    record = METRICS["yes_no_lmms_eval"].score([case["prediction"]], [Sample("1", "q", target="yes")])[0]
    assert (record["pred_yes"], record["pred_no"]) == (case["lmms-eval"] == "yes", case["lmms-eval"] == "no")


def _pope_scores(metric, case):
    samples = [Sample(str(i), "q", target=t) for i, t in enumerate(case["labels"])]
    records = METRICS[metric].score(case["predictions"], samples)
    return METRICS[metric].aggregate(columns_of(records), group_index([s.id for s in samples]))


@pytest.mark.parametrize("case", CASES["pope_sets"], ids=range(len(CASES["pope_sets"])))
def test_pope_scores_match_evaluate_py(case):
    agg = _pope_scores("yes_no", case)
    if case.get("error") == "ZeroDivisionError":  # the script crashes; graft reports 0 for the undefined ratio
        assert agg["precision"] == 0.0 and agg["f1"] == 0.0
        return
    for key in ("accuracy", "precision", "recall", "f1", "yes_ratio"):
        assert agg[key] == case[key], key


@pytest.mark.parametrize("case", CASES["pope_sets"], ids=range(len(CASES["pope_sets"])))
def test_pope_scores_match_lmms_eval(case):
    agg = _pope_scores("yes_no_lmms_eval", case)
    assert agg == case["lmms-eval"]


@pytest.mark.parametrize("case", CASES["multiple_choice"], ids=_ids(CASES["multiple_choice"], "prediction"))
def test_choice_letter_matches_vlmevalkit(case):
    assert extract_choice(case["prediction"], case["options"]) == case["choice"]


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="known difference from CoreNLP"))
    if c["caption"] in PTB_KNOWN_DIFFERENCES else c for c in CASES["ptb_tokens"]],
    ids=_ids(CASES["ptb_tokens"], "caption"))
def test_ptb_tokens_match_corenlp(case):
    assert " ".join(ptb_tokenize(case["caption"])) == case["tokens"]


@pytest.mark.parametrize("corpus", CASES["cider"], ids=range(len(CASES["cider"])))
def test_cider_scorer_matches_pycocoevalcap(corpus):
    """On the Java tokenizer's output the scorer equals CiderScorer to float rounding."""
    ours = cider_d(corpus["tokenized_predictions"], corpus["tokenized_references"], tokenize=str.split)
    assert ours == pytest.approx(corpus["cider_d"], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("corpus", CASES["cider"], ids=range(len(CASES["cider"])))
def test_cider_end_to_end_matches_pycocoevalcap(corpus):
    """Raw captions through graft's tokenizer and scorer give pycocoevalcap's scores.

    Exactly where the tokens agree; the corpus holding the known tokenizer differences
    measured +0.012% on the corpus score (+1.3% on its worst image).
    """
    ours = cider_d(corpus["predictions"], corpus["references"])
    captions = corpus["predictions"] + [r for refs in corpus["references"] for r in refs]
    java = corpus["tokenized_predictions"] + [r for refs in corpus["tokenized_references"] for r in refs]
    if all(" ".join(ptb_tokenize(c)) == t for c, t in zip(captions, java)):
        assert ours == pytest.approx(corpus["cider_d"], rel=1e-12, abs=1e-12)
    else:
        mean, official = sum(ours) / len(ours), sum(corpus["cider_d"]) / len(ours)
        assert mean == pytest.approx(official, rel=1e-3)
