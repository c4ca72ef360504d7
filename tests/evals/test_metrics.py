"""Metric functions on hand-computed cases."""

import math

import numpy as np
import pytest

from graft.evals.dataset import Sample
from graft.evals.metrics import METRICS
from graft.evals.metrics.anls import anls_score
from graft.evals.metrics.cider import cider_d
from graft.evals.metrics.multiple_choice import extract_choice, rotate_options
from graft.evals.metrics.normalize import normalize_text
from graft.evals.metrics.ptb_tokenizer import ptb_tokenize
from graft.evals.metrics.vqa_answer import normalize_answer
from graft.evals.metrics.vqa import vqa_soft_accuracy
from graft.evals.stats import columns_of, group_index


def _run(metric_name, preds, samples):
    metric = METRICS[metric_name]
    records = metric.score(preds, samples)
    return records, metric.aggregate(columns_of(records), group_index([s.group or s.id for s in samples]))


def test_normalizers():
    assert normalize_text("  The Red circle. ") == "red circle"
    assert normalize_answer("Two.") == "2"
    assert normalize_answer("the dog") == "dog"
    assert normalize_answer("dont") == "don't"
    assert normalize_answer("im") == "im"  # the official table's key is "Im", never matched


def test_vqa_soft_accuracy_ten_answers():
    answers = ["red"] * 4 + ["dark red"] * 3 + ["maroon"] * 3
    assert vqa_soft_accuracy("red", answers) == pytest.approx(1.0)
    # left out one of the 3 "dark red": 2 hits -> 2/3; the other 7 subsets: 3 hits -> 1
    assert vqa_soft_accuracy("Dark red", answers) == pytest.approx((3 * 2 / 3 + 7) / 10)
    # one annotator said dog: 9 subsets have 1 hit -> 1/3, the subset without it 0
    assert vqa_soft_accuracy("dog", ["cat"] * 9 + ["dog"]) == pytest.approx(0.3)
    assert vqa_soft_accuracy("Two.", ["2"] * 9 + ["3"]) == 1.0
    # one distinct human answer: the official code compares the strings as they are
    assert vqa_soft_accuracy("Two.", ["2"] * 10) == 0.0
    assert vqa_soft_accuracy("Two.", ["2"] * 10, definition="lmms-eval") == 1.0
    assert vqa_soft_accuracy(None, ["2"] * 10) == 0.0
    _, agg = _run("vqa_accuracy", ["red", "dog"], [Sample("a", "q", target=answers), Sample("b", "q", target=["cat"] * 9 + ["dog"])])
    assert agg["accuracy"] == pytest.approx(0.65)


# Where lmms-eval's vqav2_process_results changed: before b439d82 / 28ea9a1 (July-August 2025)
# it ran the whole EvalAIAnswerProcessor (lowercase, drop "," "?", "'s" -> " 's") on the
# prediction and normalized the references only when they differed; at 75571cf (the commit
# graft follows) both are always normalized the same way. Expected values: that commit's
# code, run on these inputs (lmms_eval/tasks/vqav2/utils.py + _task_utils/vqa_eval_metric.py).
LMMS_EVAL_75571CF = [("Two", ["two"] * 10, 1.0), ("It's red?", ["it's red"] * 10, 1.0),
                     ("2", ["two"] * 10, 1.0), ("a cat's toy", ["cat 's toy"] * 10, 0.0),
                     ("Yes", ["yes"] * 9 + ["no"], 1.0), ("Red", ["red"] * 7 + ["Red"] * 3, 1.0),
                     ("none", ["0"] * 10, 1.0)]


@pytest.mark.parametrize("prediction,answers,score", LMMS_EVAL_75571CF)
def test_vqa_lmms_eval_where_its_versions_differ(prediction, answers, score):
    assert vqa_soft_accuracy(prediction, answers, definition="lmms-eval") == score


def test_option_extraction():
    opts = {"A": "cat", "B": "dog", "C": "blue bird", "D": "fish"}
    assert extract_choice("B", opts) == "B"
    assert extract_choice("(C) blue bird", opts) == "C"
    assert extract_choice("Answer: A", opts) == "A"
    assert extract_choice("D.", opts) == "D"
    assert extract_choice("d.", opts) is None  # VLMEvalKit reads upper-case letters only
    assert extract_choice("It is a blue bird.", opts) == "C"
    assert extract_choice("Dog", opts) == "B"
    assert extract_choice("A or B", opts) is None
    assert extract_choice("no idea", opts) is None


def test_rotation_moves_answer():
    opts = {"A": "cat", "B": "dog", "C": "bird"}
    rotated, ans = rotate_options(opts, "B", 1)
    assert rotated == {"A": "dog", "B": "bird", "C": "cat"} and ans == "A"
    rotated, ans = rotate_options(opts, "B", 2)
    assert rotated[ans] == "dog" and ans == "C"


def test_circular_multiple_choice():
    opts = {"A": "w", "B": "x", "C": "y", "D": "z"}
    samples, preds = [], []
    for q, wrong_at in (("q1", None), ("q2", 2)):
        for k in range(4):
            rot, ans = rotate_options(opts, "A", k)
            samples.append(Sample(f"{q}#r{k}", "p", target=ans, options=rot, group=q, rotation=k))
            preds.append("B" if k == wrong_at and ans != "B" else ans)
    records, agg = _run("circular_choice", preds, samples)
    assert agg["accuracy"] == 1.0  # the first pass (rotation 0) of both questions is right
    assert agg["circular_accuracy"] == pytest.approx(0.5)
    assert sum(r["correct"] for r in records) == 7


def test_pope_counts():
    targets = ["yes"] * 4 + ["no"] * 4
    preds = ["Yes", "yes, there is", "No.", "yes", "yes", "Yes", "There is not.", "no"]
    samples = [Sample(str(i), "q", target=t) for i, t in enumerate(targets)]
    _, agg = _run("yes_no", preds, samples)
    # TP=3 FN=1 FP=2 TN=2
    assert agg["accuracy"] == pytest.approx(5 / 8)
    assert agg["precision"] == pytest.approx(3 / 5)
    assert agg["recall"] == pytest.approx(3 / 4)
    assert agg["f1"] == pytest.approx(2 * 0.6 * 0.75 / 1.35)
    assert agg["yes_ratio"] == pytest.approx(5 / 8)


def test_anls():
    assert anls_score("Hello", ["hello"]) == 1.0
    assert anls_score("helo", ["hello"]) == pytest.approx(0.8)
    assert anls_score("ab", ["ac"]) == 0.5  # a similarity of exactly 0.5 is kept
    assert anls_score("abc", ["a"]) == 0.0
    assert anls_score("abc", ["xyz", "abd"]) == pytest.approx(1 - 1 / 3)
    assert anls_score(None, ["x"]) == 0.0


def test_cider_d_tiny_corpus():
    assert ptb_tokenize("A, B!") == ["a", "b"]
    assert ptb_tokenize("A black-and-white dog's toy.") == ["a", "black-and-white", "dog", "'s", "toy"]
    refs = [["a b"], ["c d"]]
    scores = cider_d(["a b", "c"], refs)
    # image 1: unigram and bigram vectors match exactly, no 3/4-grams exist: (1+1+0+0)/4*10
    assert scores[0] == pytest.approx(5.0)
    # image 2: unigram cosine with clipping = 1/sqrt(2); bigram length 0 vs 1 -> exp(-1/72)
    assert scores[1] == pytest.approx(10 * (1 / math.sqrt(2)) * math.exp(-1 / 72) / 4)
    # a word in every image's references carries no information
    assert cider_d(["a", "a"], [["a b"], ["a c"]]) == [0.0, 0.0]
    assert cider_d(["x y z w", None], [["x y z w"], ["q r s t"]])[0] == pytest.approx(10.0)


def test_exact_match_and_failures():
    samples = [Sample("1", "q", target="Red"), Sample("2", "q", target=["7", "seven"]), Sample("3", "q", target="x")]
    records, agg = _run("exact_match", ["red.", "Seven", None], samples)
    assert [r["exact_match"] for r in records] == [1.0, 1.0, 0.0]
    assert agg["accuracy"] == pytest.approx(2 / 3)
    assert np.isfinite(agg["accuracy"])


def test_letter_a_counts_as_option_a():
    """VLMEvalKit reads a leading "A" as the letter, article or not."""
    opts = {"A": "cat", "B": "small dog"}
    assert extract_choice("A small dog", opts) == "A"
    assert extract_choice("I think B is right", opts) == "B"
    assert extract_choice("I pick A", opts) == "A"
