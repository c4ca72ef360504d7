"""vLLM `LLM.generate` with the graft plugin gives graft's engine's greedy tokens, for SigLIP and
CLIP grafts over Llama / Qwen2 / Qwen3 / GLM4 / Qwen3-MoE / GLM-4.5-MoE (tiny, random) and the
real SmolLM2: prompts with
one image, two images of different sizes, and none. All exports run in one vLLM process.

Two engines with different kernels agree to float noise, not to the bit: where graft's own top
two choices are closer than TIE (logprob), vLLM may take the other one, and from there the
sequences may part. Such a step is allowed only when vLLM's token is one of graft's tied ones;
the tiny random LLMs are near-uniform, the real SmolLM2 is decisive."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import pytest

from graft.inject import IMAGE_PLACEHOLDER
from tests.serving.vllm_plugin.conftest import graft_engine, image, vllm_env

FAMILIES = ("llama", "qwen2", "qwen3", "glm4", "qwen3_moe", "glm4_moe", "smollm2")
TOWERS = ("siglip", "clip")
MAX_TOKENS = 8
TIE = 0.01
# (user text with <image> markers, image sizes): sizes differ so preprocessing (resize, crop)
# is exercised; each image is random noise seeded by its position
PROMPTS = [
    ("<image>\nWhat is shown in the image?", [(50, 40)]),
    ("Compare <image> with <image>. Which is brighter?", [(23, 37), (300, 200)]),
    ("Describe <image> in one word.", [(64, 64)]),
    ("Hello! Say something about colors.", []),
]


def _chats():
    return [([{"role": "user", "content": text}], [image(10 * k + i, s) for i, s in enumerate(sizes)])
            for k, (text, sizes) in enumerate(PROMPTS)]


def _graft_outputs(run_dir) -> list:
    from graft.serving import SamplingParams
    from graft.serving.multimodal.front import generate_chats

    engine = graft_engine(run_dir)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    done = generate_chats(engine, {str(k): chat for k, chat in enumerate(_chats())}, params)
    return [done[str(k)] for k in range(len(PROMPTS))]


def _parting(want, got: list[int]) -> int | None:
    """The first step where `got` leaves graft's greedy tokens (None: never); an error unless
    graft's logprobs there have vLLM's token within TIE of the best."""
    for j, (a, b) in enumerate(zip(want.token_ids, got)):
        if a != b:
            lp = want.logprobs[j]
            assert b in lp and lp[a] - lp[b] < TIE, (
                f"step {j}: vLLM chose {b}, graft {a} with logprobs {lp}: not a near-tie")
            return j
    return None


@pytest.fixture(scope="module")
def vllm_results(vllm_python, vllm_export, tmp_path_factory):
    """(family, tower) -> vLLM's outputs per prompt; one driver process for every export."""
    from transformers import AutoTokenizer

    work = tmp_path_factory.mktemp("vllm_jobs")
    files = []
    for k, (_, images) in enumerate(_chats()):
        files.append([])
        for i, im in enumerate(images):
            files[-1].append(str(work / f"p{k}_{i}.png"))
            im.save(files[-1][-1])
    jobs, keys = [], []
    for family in FAMILIES:
        for tower in TOWERS:
            try:
                _, export = vllm_export(family, tower)
            except pytest.skip.Exception:
                continue  # SmolLM2 not prepared: its cases skip below
            tokenizer = AutoTokenizer.from_pretrained(str(export))  # the export's own template
            prompts = [{"prompt": tokenizer.apply_chat_template(messages, tokenize=False,
                                                                add_generation_prompt=True),
                        "images": files[k]} for k, (messages, _) in enumerate(_chats())]
            jobs.append({"model": str(export), "prompts": prompts, "max_tokens": MAX_TOKENS})
            keys.append((family, tower))
    (work / "jobs.json").write_text(json.dumps(jobs))
    driver = Path(__file__).with_name("vllm_driver.py")
    proc = subprocess.run([vllm_python, str(driver), str(work / "jobs.json"), str(work / "out.json")],
                          env=vllm_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"), cwd=work,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((work / "out.json").read_text())
    return {key: r["outputs"] for key, r in zip(keys, results)}


@pytest.mark.slow
@pytest.mark.parametrize("tower", TOWERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_greedy_tokens_equal_graft_engine(family, tower, vllm_results, vllm_export):
    run, export = vllm_export(family, tower)
    image_id = json.loads((export / "config.json").read_text())["graft"]["image_token_id"]
    parted = {}
    for k, (want, got) in enumerate(zip(_graft_outputs(run), vllm_results[family, tower])):
        # the same prompt ids, image runs sized alike (graft's placeholder is vLLM's <image> id)
        want_prompt = [image_id if t == IMAGE_PLACEHOLDER else t for t in want.prompt_token_ids]
        assert got["prompt_token_ids"] == want_prompt, f"prompt {k}"
        assert len(got["token_ids"]) == len(want.token_ids) == MAX_TOKENS
        step = _parting(want, got["token_ids"])
        if step is not None:
            parted[PROMPTS[k][0]] = step
    if family == "smollm2":  # a trained LLM has no near-ties here: every token must agree
        assert not parted, parted
    if parted:  # shown in pytest's summary: how often the tiny LLMs' ties decided
        warnings.warn(f"{family}-{tower}: vLLM left graft's tokens at near-ties {parted}")
