"""HF transformers on the requests lm-eval sent to graft serve (its --log_samples output):
the same loglikelihoods and greedy flags (graft_mc), the same greedy text (graft_gen).

    python hf_parity.py MODEL_DIR SAMPLES_DIR
"""
import glob
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, out_dir = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def enc(text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids  # as lm-eval's API models encode


worst, flags, n = 0.0, 0, 0
for line in open(glob.glob(f"{out_dir}/samples_graft_mc*.jsonl")[0]):
    d = json.loads(line)
    for args, (resp,) in zip(d["arguments"].values(), d["resps"]):
        ctx, cont = args["arg_0"], args["arg_1"]
        k = len(ctx) - len(ctx.rstrip())
        if k:
            ctx, cont = ctx[:-k], ctx[-k:] + cont
        whole, head = enc(ctx + cont), enc(ctx)
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
        rows = lp[len(head) - 1:len(whole) - 1]
        target = torch.tensor(whole[len(head):])
        ll = float(rows.gather(1, target[:, None]).sum())
        greedy = bool((rows.argmax(-1) == target).all())
        worst = max(worst, abs(ll - float(resp[0])))
        flags += greedy != (resp[1] == "True")
        n += 1
print(f"multiple choice: {n} loglikelihoods, max |graft - HF| = {worst:.2e}, "
      f"greedy flags differing: {flags}")

same, total = 0, 0
for line in open(glob.glob(f"{out_dir}/samples_graft_gen*.jsonl")[0]):
    d = json.loads(line)
    prompt = d["arguments"]["gen_args_0"]["arg_0"]
    ids = torch.tensor([enc(prompt)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                             do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    for stop in ("\n", "."):
        text = text.split(stop)[0]
    same += text == d["resps"][0][0]
    total += 1
print(f"generate_until: {same}/{total} greedy answers equal HF's")
