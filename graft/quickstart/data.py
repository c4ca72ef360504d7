"""Quickstart data: synthetic shape scenes and scikit-learn's handwritten digits as PNGs,
with LLaVA-format training JSON and held-out eval JSONL files (short one-word answers)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from graft.errors import GraftConfigError
from graft.io import atomic_write_json, atomic_write_text

COLORS = {  # name -> RGB; far apart so that one word names each without doubt
    "red": (215, 35, 35), "green": (35, 155, 55), "blue": (35, 75, 215),
    "yellow": (235, 205, 25), "orange": (240, 130, 25), "purple": (135, 50, 175),
}
KINDS = ("circle", "square", "triangle", "star")
NUMBER_WORDS = ("zero", "one", "two", "three")
# Plain prompts: the grafted model must answer them exactly as SmolLM2 does. Enough of them
# that a half split (graft quantize's search vs held-out) still has ~14 per side: with 2 per
# side one changed answer moved the task score by 0.5 and decided the search.
TEXT_PROMPTS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Write one sentence about the sea.",
    "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in the solar system?",
    "Give two examples of mammals.",
    "How many days are in a leap year?",
    "What gas do plants take in from the air?",
    "Translate 'thank you' into Spanish.",
    "What is 12 times 7?",
    "Name the longest river in Africa.",
    "Explain what a noun is in one sentence.",
    "What is the chemical symbol for gold?",
    "List the four seasons of the year.",
    "How many continents are there?",
    "Write a short greeting for a birthday card.",
    "What is the freezing point of water in Fahrenheit?",
    "Which ocean is the largest?",
    "Suggest a name for a pet cat.",
    "What does a thermometer measure?",
    "How many minutes are in an hour?",
    "Describe the color of the sky on a clear day.",
    "What is the opposite of hot?",
    "Name a fruit that is yellow.",
    "Give one tip for staying healthy.",
    "What is the square root of 81?",
)
DIGIT_QUESTION = "Which digit is shown?"
FORMAT = 3  # bump when the generator changes, so data written by an older one is redone
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass
class DataParams:
    seed: int = 0  # seeds scenes, splits and question order
    # 1200 + 1200 training samples: the demo's 300 steps x 8 see each once. Samples seen
    # twice generalized worse (400 + 400 over 200 steps: held-out digits 0.85 vs 0.91 with
    # 800 + 800, seed 0; README: Quickstart).
    train_scenes: int = 1200  # synthetic scenes for training
    val_scenes: int = 100  # held-out scenes (eval: shape_color, shape_kind)
    digits_test: int = 150  # held-out digits (eval: digits), drawn from the 1797 by seed
    digits_train: int | None = 1200  # training digits from the rest (None: all of the rest)
    image_size: int = 128  # PNG side in pixels


@dataclass
class Scene:
    kind: str
    color: str
    count: int
    xs: list[float]  # shape centres, as fractions of the width (for position answers)


# ---- scenes ----------------------------------------------------------------------------
def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if kind == "square":
        pts = [(math.pi / 4 + k * math.pi / 2) for k in range(4)]
        return [(cx + r * math.cos(a + angle), cy + r * math.sin(a + angle)) for a in pts]
    if kind == "triangle":
        pts = [(-math.pi / 2 + k * 2 * math.pi / 3) for k in range(3)]
        return [(cx + r * math.cos(a + angle), cy + r * math.sin(a + angle)) for a in pts]
    # star: five points, inner radius 0.45 r
    out = []
    for k in range(10):
        rad = r if k % 2 == 0 else 0.45 * r
        a = -math.pi / 2 + k * math.pi / 5 + angle
        out.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
    return out


def draw_scene(rng: np.random.Generator, size: int) -> tuple[Image.Image, Scene]:
    """One scene: 1-3 shapes of one kind and one colour on a light, slightly tinted ground."""
    kind = KINDS[rng.integers(len(KINDS))]
    color = list(COLORS)[rng.integers(len(COLORS))]
    count = int(rng.integers(1, 4))
    ground = tuple(int(v) for v in rng.integers(215, 256, size=3))
    img = Image.new("RGB", (size, size), ground)
    draw = ImageDraw.Draw(img)
    r = size * float(rng.uniform(0.11, 0.18))
    centres: list[tuple[float, float]] = []
    while len(centres) < count:  # rejection sampling: shapes never overlap
        c = tuple(float(v) for v in rng.uniform(r + 2, size - r - 2, size=2))
        if all(math.dist(c, o) > 2.2 * r for o in centres):
            centres.append(c)
        elif rng.random() < 0.05:  # crowded: shrink a little rather than retry forever
            r *= 0.95
    base = np.array(COLORS[color])
    for cx, cy in centres:
        fill = tuple(int(v) for v in np.clip(base + rng.integers(-20, 21, size=3), 0, 255))
        if kind == "circle":
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        else:
            draw.polygon(_polygon(kind, cx, cy, r, float(rng.uniform(-0.25, 0.25))), fill=fill)
    return img, Scene(kind, color, count, [c[0] / size for c in centres])


def scene_qa(scene: Scene) -> dict[str, tuple[str, str]]:
    """Question/answer pairs by task; eval uses the same wording as training."""
    verb = "is the shape" if scene.count == 1 else "are the shapes"
    qa = {
        "shape_color": (f"What color {verb}?", scene.color),
        "shape_kind": ("What kind of shape is shown?", scene.kind),
        "count": ("How many shapes are there?", str(scene.count)),
    }
    if scene.count == 1:
        x = scene.xs[0]
        side = "left" if x < 0.4 else "right" if x > 0.6 else "center"
        qa["position"] = ("Is the shape on the left, in the center or on the right?", side)
    kinds = scene.kind + ("s" if scene.count > 1 else "")
    where = f" on the {qa['position'][1]}" if "position" in qa and qa["position"][1] != "center" else ""
    caption = f"{NUMBER_WORDS[scene.count].capitalize()} {scene.color} {kinds}{where}."
    qa["caption"] = ("Describe the image in a few words.", caption)
    return qa


def scene_conversation(scene: Scene, rng: np.random.Generator) -> list[dict]:
    """Colour and kind always, plus one of count/position/caption; random order, so every
    question type is also seen as the first turn (the only turn at eval time)."""
    qa = scene_qa(scene)
    extra = [k for k in ("count", "position", "caption") if k in qa]
    tasks = ["shape_color", "shape_kind", extra[rng.integers(len(extra))]]
    rng.shuffle(tasks)
    conv = []
    for i, task in enumerate(tasks):
        question, answer = qa[task]
        conv.append({"from": "human", "value": ("<image>\n" if i == 0 else "") + question})
        conv.append({"from": "gpt", "value": answer})
    return conv


# ---- digits ----------------------------------------------------------------------------
def digit_conversation(digit: int, rng: np.random.Generator) -> list[dict]:
    """Three turns that all need the digit's identity, in random order. Scene samples are
    about as long, so batches pad little, and each image gives three times the signal."""
    turns = [(DIGIT_QUESTION, str(digit)),
             ("Is the digit even or odd?", "even" if digit % 2 == 0 else "odd"),
             ("Write the digit as a word.", DIGIT_WORDS[digit])]
    conv = []
    for i, k in enumerate(rng.permutation(len(turns))):
        question, answer = turns[k]
        conv.append({"from": "human", "value": ("<image>\n" if i == 0 else "") + question})
        conv.append({"from": "gpt", "value": answer})
    return conv


def digit_image(pixels: np.ndarray, size: int) -> Image.Image:
    """An 8x8 sklearn digit (0..16, ink high) as dark ink on white, smoothly upscaled."""
    gray = (255 - pixels.astype(np.float32) * (255 / 16)).clip(0, 255).astype(np.uint8)
    return Image.fromarray(gray, "L").resize((size, size), Image.BICUBIC).convert("RGB")


# ---- writing ---------------------------------------------------------------------------
def validate(params: DataParams) -> None:
    for name in ("train_scenes", "val_scenes", "digits_test"):
        if getattr(params, name) < 1:
            raise GraftConfigError(f"{name}={getattr(params, name)}: must be >= 1")
    if params.digits_test >= 1797 - 10:
        raise GraftConfigError(f"digits_test={params.digits_test}: load_digits has 1797 "
                               "images; leave at least 10 for training")
    if params.digits_train is not None and params.digits_train < 1:
        raise GraftConfigError(f"digits_train={params.digits_train}: must be >= 1 or None")
    if not 32 <= params.image_size <= 1024:
        raise GraftConfigError(f"image_size={params.image_size}: use 32..1024 pixels")


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def write_quickstart_data(out: str | Path, params: DataParams | None = None) -> dict:
    """Write images, train.json, val.json and eval/*.jsonl under `out`; returns meta.json."""
    from sklearn.datasets import load_digits

    params = params or DataParams()
    validate(params)
    out = Path(out)
    try:
        (out / "images").mkdir(parents=True, exist_ok=True)
        (out / "eval").mkdir(exist_ok=True)
    except OSError as err:
        raise GraftConfigError(f"--out {out}: cannot create the folder ({err.strerror})") from None
    (out / "meta.json").unlink(missing_ok=True)  # only a finished run writes it back
    rng = np.random.default_rng(params.seed)
    size = params.image_size
    train, val, evals = [], [], {"shape_color": [], "shape_kind": [], "digits": []}

    for split, n in (("train", params.train_scenes), ("val", params.val_scenes)):
        for i in range(n):
            img, scene = draw_scene(rng, size)
            sid = f"scene_{split}_{i:05d}"
            rel = f"images/{sid}.png"
            img.save(out / rel)
            sample = {"id": sid, "image": rel, "conversations": scene_conversation(scene, rng)}
            (train if split == "train" else val).append(sample)
            if split == "val":
                for task, (question, answer) in scene_qa(scene).items():
                    if task in evals:
                        evals[task].append({"id": sid, "image": rel, "question": question,
                                            "answer": answer})

    digits = load_digits()
    order = rng.permutation(len(digits.target))
    test_idx = order[: params.digits_test]
    train_idx = order[params.digits_test:][: params.digits_train]
    for split, idx in (("train", train_idx), ("test", test_idx)):
        for j in idx:
            sid = f"digit_{split}_{int(j):04d}"
            rel = f"images/{sid}.png"
            digit_image(digits.images[j], size).save(out / rel)
            answer = str(int(digits.target[j]))
            if split == "train":
                train.append({"id": sid, "image": rel,
                              "conversations": digit_conversation(int(answer), rng)})
            else:
                evals["digits"].append({"id": sid, "image": rel, "question": DIGIT_QUESTION,
                                        "answer": answer})

    order = rng.permutation(len(train))  # scenes and digits interleaved for training
    atomic_write_json(out / "train.json", [train[k] for k in order])
    atomic_write_json(out / "val.json", val)
    for task, rows in evals.items():
        atomic_write_text(out / "eval" / f"{task}.jsonl", _jsonl(rows))
    atomic_write_text(out / "eval" / "text_only.jsonl",
                      _jsonl([{"id": f"text_{k}", "question": q} for k, q in enumerate(TEXT_PROMPTS)]))
    meta = {"format": FORMAT, "params": asdict(params), "train_samples": len(train),
            "val_samples": len(val),
            "eval": {task: len(rows) for task, rows in evals.items()}}
    atomic_write_json(out / "meta.json", meta)
    return meta


def data_is_current(out: str | Path, params: DataParams) -> bool:
    """True when `out` holds a finished write by this generator with these parameters."""
    path = Path(out) / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == FORMAT and meta.get("params") == asdict(params)
