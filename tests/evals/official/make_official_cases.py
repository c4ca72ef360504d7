"""Run the official evaluators on crafted cases and write their scores to official_cases.json.

Run once, outside the repo's environment, with the official sources fetched beside it:

    python -m venv /tmp/offvenv && /tmp/offvenv/bin/pip install numpy
    /tmp/offvenv/bin/pip install --no-deps pycocoevalcap==1.2     # CIDEr + the Java PTB tokenizer
    /tmp/offvenv/bin/python tests/evals/official/make_official_cases.py \\
        --vqa   GT-Vision-Lab/VQA                 (commit a013f00) \\
        --pope  AoiDragon/POPE                    (commit 08d957b) \\
        --lmms  EvolvingLMMs-Lab/lmms-eval        (commit 75571cf) \\
        --vlmeval open-compass/VLMEvalKit         (commit e8e78f0) \\
        --fakecap pycocoevalcap/example/captions_val2014_fakecap_results.json
    (each flag takes the checkout's folder; java must be on PATH for the PTB tokenizer)

Nothing from those projects is copied into graft: this script executes their files as
they are (vqaEval.py after turning its Python 2 print statements into calls, the only
change) and records inputs and outputs. The test (test_official_metrics.py) reads the JSON.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import statistics
import sys
import tempfile
import types
from pathlib import Path

from official_inputs import ANLS_CASES, MC_CASES, POPE_ANSWERS, POPE_SETS, PTB_CAPTIONS, VQA_CASES, caption_corpora

OUT = Path(__file__).with_name("official_cases.json")


def functions_from(path: Path, names: list[str], namespace: dict) -> dict:
    """Exec the named top-level defs of a file (decorators left out) in `namespace`."""
    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            exec(ast.get_source_segment(source, node), namespace)
    return namespace


# --- VQA: GT-Vision-Lab vqaEval.py and lmms-eval vqav2_process_results -------------------
def vqa_official(root: Path):
    source = (root / "PythonEvaluationTools/vqaEvaluation/vqaEval.py").read_text()
    source = source.replace('print "computing accuracy"', 'print("computing accuracy")')
    source = source.replace('print "Done computing accuracy"', 'print("Done computing accuracy")')
    namespace: dict = {}
    exec(compile(source, "vqaEval.py", "exec"), namespace)
    VQAEval = namespace["VQAEval"]

    class _Store:
        def __init__(self, qa):
            self.qa = qa

        def getQuesIds(self):
            return list(self.qa)

    def score(pred: str, answers: list[str]) -> float:
        gts = _Store({1: {"answers": [{"answer": a, "answer_id": i + 1} for i, a in enumerate(answers)],
                          "question_type": "t", "answer_type": "other"}})
        ev = VQAEval(gts, _Store({1: {"answer": pred}}), n=2)
        raw = {}
        ev.setEvalQA = lambda qid, acc: raw.__setitem__(qid, acc)  # keep the unrounded value
        ev.updateProgress = lambda progress: None
        with contextlib.redirect_stdout(io.StringIO()):
            ev.evaluate()
        return raw[1]

    return score


def vqa_lmms(root: Path):
    ns = functions_from(root / "lmms_eval/tasks/_task_utils/vqa_eval_metric.py", ["EvalAIAnswerProcessor"],
                        {"re": __import__("re")})
    ns = functions_from(root / "lmms_eval/tasks/vqav2/utils.py", ["vqav2_process_results"],
                        {"statistics": statistics, "EvalAIAnswerProcessor": ns["EvalAIAnswerProcessor"]})

    def score(pred: str, answers: list[str]) -> float:
        doc = {"question_id": 1, "answers": [{"answer": a, "answer_id": i + 1} for i, a in enumerate(answers)]}
        return ns["vqav2_process_results"](doc, [pred])["exact_match"]

    return score


# --- ANLS: lmms-eval api/metrics.py -------------------------------------------------------
def anls_lmms(root: Path):
    ns = functions_from(root / "lmms_eval/api/metrics.py", ["levenshtein_distance", "anls"], {})
    return lambda pred, answers: float(ns["anls"](answers, [pred])["anls"])


# --- POPE: evaluate.py, run as a script on files --------------------------------------------
def pope_official(root: Path):
    source = (root / "evaluate.py").read_text()

    def run(answers: list[str], labels: list[str]) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            ans, lab = Path(tmp, "answers.jsonl"), Path(tmp, "labels.jsonl")
            ans.write_text("".join(json.dumps({"answer": a}) + "\n" for a in answers))
            lab.write_text("".join(json.dumps({"label": x}) + "\n" for x in labels))
            code = source.replace("ans_file = ''", f"ans_file = {str(ans)!r}", 1)
            code = code.replace("label_file = ''", f"label_file = {str(lab)!r}", 1)
            ns: dict = {}
            with contextlib.redirect_stdout(io.StringIO()):
                try:
                    exec(compile(code, "evaluate.py", "exec"), ns)
                except ZeroDivisionError:
                    return {"error": "ZeroDivisionError", "pred_yes": [a["answer"] == "yes" for a in ns["answers"]]}
        return {"accuracy": ns["acc"], "precision": ns["precision"], "recall": ns["recall"], "f1": ns["f1"],
                "yes_ratio": ns["yes_ratio"], "pred_yes": [a["answer"] == "yes" for a in ns["answers"]]}

    return run


def pope_lmms(root: Path):
    names = ["pope_process_results"] + [f"pope_aggregate_{m}" for m in
                                         ("accuracy", "precision", "recall", "f1_score", "yes_ratio")]
    ns = functions_from(root / "lmms_eval/tasks/pope/utils.py", names, {})

    def run(answers: list[str], labels: list[str]) -> dict:
        rows = [ns["pope_process_results"]({"question_id": i, "answer": lab}, [a])["pope_accuracy"]
                for i, (a, lab) in enumerate(zip(answers, labels))]
        keys = {"accuracy": "accuracy", "precision": "precision", "recall": "recall", "f1": "f1_score",
                "yes_ratio": "yes_ratio"}
        return {**{k: ns[f"pope_aggregate_{v}"](rows) for k, v in keys.items()},
                "read_as": [r["prediction"] for r in rows]}

    return run


# --- MMBench answer letters: VLMEvalKit matching_util.py ------------------------------------
def mc_vlmeval(root: Path):
    stub = types.ModuleType("vlmeval.smp.log")
    stub.get_logger = lambda name: types.SimpleNamespace(info=print, warning=print)
    for name in ("vlmeval", "vlmeval.smp"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["vlmeval.smp.log"] = stub
    ns: dict = {"__name__": "matching_util"}
    exec(compile((root / "vlmeval/utils/matching_util.py").read_text(), "matching_util.py", "exec"), ns)
    return lambda answer, options: ns["can_infer"](answer, dict(options)) or None


# --- CIDEr-D: pycocoevalcap's PTBTokenizer (Java) and Cider scorer --------------------------
def coco_tools():
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    def tokenize(captions: list[str]) -> list[str]:
        out = PTBTokenizer().tokenize({i: [{"caption": c}] for i, c in enumerate(captions)})
        return [out[i][0] for i in range(len(captions))]

    def cider(preds: list[str], refs: list[list[str]]) -> dict:
        """Both steps as COCOEvalCap runs them: PTB tokens of every caption, then CIDEr-D."""
        flat = tokenize(preds + [r for rs in refs for r in rs])
        tok_preds, rest = flat[:len(preds)], flat[len(preds):]
        tok_refs = [[rest.pop(0) for _ in rs] for rs in refs]
        _, scores = Cider().compute_score({i: rs for i, rs in enumerate(tok_refs)},
                                          {i: [p] for i, p in enumerate(tok_preds)})
        return {"predictions": preds, "references": refs, "tokenized_predictions": tok_preds,
                "tokenized_references": tok_refs, "cider_d": [float(s) for s in scores]}

    return tokenize, cider


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("vqa", "pope", "lmms", "vlmeval"):
        parser.add_argument(f"--{flag}", type=Path, required=True)
    parser.add_argument("--fakecap", type=Path, help="pycocoevalcap example/captions_val2014_fakecap_results.json")
    args = parser.parse_args()
    fakecap = [c["caption"] for c in json.loads(args.fakecap.read_text())] if args.fakecap else None
    vqa_gt, vqa_lm = vqa_official(args.vqa), vqa_lmms(args.lmms)
    anls = anls_lmms(args.lmms)
    pope, pope_lm = pope_official(args.pope), pope_lmms(args.lmms)
    can_infer = mc_vlmeval(args.vlmeval)
    tokenize, cider = coco_tools()
    out = {
        "sources": {"GT-Vision-Lab/VQA": "a013f00", "EvolvingLMMs-Lab/lmms-eval": "75571cf",
                    "AoiDragon/POPE": "08d957b", "open-compass/VLMEvalKit": "e8e78f0",
                    "salaniz/pycocoevalcap": "1.2 (ad63453), stanford-corenlp 3.4.1"},
        "vqa": [{"prediction": p, "answers": a, "gt-vision-lab": vqa_gt(p, list(a)), "lmms-eval": vqa_lm(p, list(a))}
                for p, a in VQA_CASES],
        "anls": [{"prediction": p, "answers": a, "anls": anls(p, list(a))} for p, a in ANLS_CASES],
        "pope_answers": [{"prediction": p, "yes": y, "lmms-eval": lm} for p, y, lm in
                         zip(POPE_ANSWERS, pope(POPE_ANSWERS, ["yes"] * len(POPE_ANSWERS))["pred_yes"],
                             pope_lm(POPE_ANSWERS, ["yes"] * len(POPE_ANSWERS))["read_as"])],
        "pope_sets": [{"predictions": p, "labels": lab, **{k: v for k, v in pope(p, lab).items() if k != "pred_yes"},
                       "lmms-eval": {k: v for k, v in pope_lm(p, lab).items() if k != "read_as"}}
                      for p, lab in POPE_SETS],
        "multiple_choice": [{"prediction": p, "options": o, "choice": can_infer(p, o)} for p, o in MC_CASES],
        "ptb_tokens": [{"caption": c, "tokens": t} for c, t in zip(PTB_CAPTIONS, tokenize(PTB_CAPTIONS))],
        "cider": [cider(p, r) for p, r in caption_corpora(fakecap)],
    }
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}: " + ", ".join(f"{k} {len(v)}" for k, v in out.items() if isinstance(v, list)))


if __name__ == "__main__":
    main()
