"""Two small lm-evaluation-harness tasks, written into OUT (no hub: the data is made here):
graft_mc (34 multiple-choice questions: loglikelihood requests, `echo` + `logprobs`) and
graft_gen (12 completions: generate_until requests). docs/evals.md runs them against
`graft serve`.

    python make_tasks.py OUT
"""
import json
import random
import sys
from pathlib import Path

CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Russia", "Moscow"),
            ("China", "Beijing"), ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Norway", "Oslo")]
OPPOSITES = [("hot", "cold"), ("up", "down"), ("big", "small"), ("day", "night"),
             ("fast", "slow"), ("open", "closed"), ("happy", "sad"), ("early", "late")]


def choice(rng, pairs, right):
    options = rng.sample([b for _, b in pairs if b != right], 3) + [right]
    rng.shuffle(options)
    return [" " + o for o in options], options.index(right)


def main(out: Path) -> None:
    rng = random.Random(0)
    mc = []
    for country, city in CAPITALS:
        options, answer = choice(rng, CAPITALS, city)
        mc.append({"question": f"Question: What is the capital of {country}?\nAnswer:",
                   "choices": options, "answer": answer})
    for _ in range(14):
        x, y = rng.randint(1, 9), rng.randint(1, 9)
        options = sorted({x + y - 1, x + y, x + y + 1, x + y + 2})
        mc.append({"question": f"Question: What is {x} + {y}?\nAnswer:",
                   "choices": [f" {v}" for v in options], "answer": options.index(x + y)})
    for word, opposite in OPPOSITES:
        options, answer = choice(rng, OPPOSITES, opposite)
        mc.append({"question": f"Question: What is the opposite of {word}?\nAnswer:",
                   "choices": options, "answer": answer})
    gen = [{"question": f"The capital of Spain is Madrid. The capital of {country} is",
            "answer": " " + city} for country, city in CAPITALS]
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("mc", mc), ("gen", gen)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\n"
    (out / "graft_mc.yaml").write_text(
        "task: graft_mc\n" + data.format(out.resolve() / "mc.jsonl")
        + 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n")
    (out / "graft_gen.yaml").write_text(
        "task: graft_gen\n" + data.format(out.resolve() / "gen.jsonl")
        + 'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 8\n  temperature: 0\n'
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "    ignore_case: true\n    ignore_punctuation: true\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
