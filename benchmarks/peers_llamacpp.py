"""llama.cpp as a peer of `graft bench peers`: find or build it, convert a checkpoint to GGUF
with its own converter, and time it with its own tools (llama-bench, llama-batched-bench).

A built tree is a directory with llama-bench, llama-batched-bench and llama-quantize under
bin/ or build/bin/, and the source's convert_hf_to_gguf.py + gguf-py. Without one, the
llama.cpp vendored by the llama-cpp-python source distribution is built into a cache dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("llama-bench", "llama-batched-bench", "llama-quantize")
# peer format -> how it is made: by the converter (--outtype) or by llama-quantize from F32
CONVERTED = {"f32": "f32", "bf16": "bf16"}
QUANTIZED = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q4_k_m": "Q4_K_M"}
REPEATS = 3  # llama-bench repetitions after its own warm-up (graft's prefill: median of 3)
# ggml's AMX kernels crash on some AMX machines; the AVX-512/AVX2 paths are what we compare
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DGGML_AMX_TILE=OFF",
               "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF", "-DLLAMA_CURL=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF")
SDIST = "llama-cpp-python"

# The converter names a BPE pre-tokenizer by hashing what a known model's tokenizer makes of a
# test string; a tiny test tokenizer matches none. The tokenizer takes no part in any timed
# matmul: when the converter knows none, call it Qwen2's. Llama's converter tries a
# SentencePiece vocab first and falls back to the HF tokenizer on FileNotFoundError, but
# imports sentencepiece (not one of graft's dependencies) before it looks for tokenizer.model:
# look first, so a checkpoint without that file needs no sentencepiece.
_CONVERT = """import sys
sys.path.insert(0, sys.argv.pop(1))
import convert_hf_to_gguf as c
from conversion.base import TextModel
known_pre, known_spm = TextModel.get_vocab_base_pre, TextModel._create_vocab_sentencepiece
def pre(self, tokenizer):
    try:
        return known_pre(self, tokenizer)
    except NotImplementedError:
        return "qwen2"
def spm(self):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return known_spm(self)
TextModel.get_vocab_base_pre, TextModel._create_vocab_sentencepiece = pre, spm
sys.exit(c.main())
"""


class PeerUnavailable(Exception):
    """A peer that cannot be found, built or started: the message says why, in one line."""


@dataclass
class LlamaCpp:
    bin_dir: Path
    src_dir: Path
    build_flags: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        return {"bin_dir": str(self.bin_dir), "src_dir": str(self.src_dir),
                "build_flags": self.build_flags}

    def gguf(self, model_dir: Path, fmt: str, cache: Path) -> Path:
        """The checkpoint in `fmt`, converted (and cached under `cache`) on first use."""
        out = cache / f"{fmt}.gguf"
        if out.exists():
            return out
        cache.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".partial")
        if fmt in CONVERTED:
            with tempfile.NamedTemporaryFile("w", suffix=".py") as script:
                script.write(_CONVERT)
                script.flush()
                env = dict(os.environ, PYTHONPATH=str(self.src_dir / "gguf-py"))
                _check([sys.executable, script.name, str(self.src_dir), str(model_dir),
                        "--outtype", CONVERTED[fmt], "--outfile", str(tmp)], env=env,
                       what=f"convert_hf_to_gguf.py --outtype {CONVERTED[fmt]}")
        else:
            _check([str(self.bin_dir / "llama-quantize"), str(self.gguf(model_dir, "f32", cache)),
                    str(tmp), QUANTIZED[fmt]], what=f"llama-quantize {QUANTIZED[fmt]}")
        tmp.rename(out)
        return out

    def bench(self, gguf: Path, threads: int, prompt_len: int, decode_tokens: int,
              batch: int, batch_prompt: int) -> dict[str, float]:
        """tok/s of batch-1 decode, prefill of `prompt_len` tokens, and decode of `batch`
        sequences (`batch_prompt`-token prompts, decode_tokens // 2 new tokens each), as
        graft bench engine --quantization measures them."""
        res = _check([str(self.bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads),
                      "-p", str(prompt_len), "-n", str(decode_tokens), "-r", str(REPEATS), "-o", "json"],
                     what="llama-bench")
        rows = json.loads(res.stdout)
        out = {("prefill" if r["n_prompt"] else "batch1_decode"): r["avg_ts"] for r in rows}
        new = max(decode_tokens // 2, 1)
        res = _check([str(self.bin_dir / "llama-batched-bench"), "-m", str(gguf), "-t",
                      str(threads), "-c", str(batch * (batch_prompt + new) + 64), "-b", "2048",
                      "-npp", str(batch_prompt), "-ntg", str(new), "-npl", str(batch),
                      "--output-format", "jsonl"], what="llama-batched-bench")
        row = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])
        out["batch_decode"] = row["speed_tg"]
        return out


def gguf_cache(out: Path | None, model_dir: Path) -> Path:
    """Where the GGUF files of `model_dir` live: next to the output, keyed by the checkpoint's
    path, sizes and modification times (a changed checkpoint converts again)."""
    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".json", ".safetensors"))
    key = hashlib.sha256(str(model_dir.resolve()).encode())
    for p in files:
        st = p.stat()
        key.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    base = out.parent if out else Path.cwd()
    return base / f"{model_dir.name}-gguf-{key.hexdigest()[:10]}"


def find(tree: Path | None, cache_dir: Path, build: bool, jobs: int) -> LlamaCpp:
    """The llama.cpp at `tree`, else one built earlier in `cache_dir`, else (when `build`) one
    built now from the llama-cpp-python sdist. Raises PeerUnavailable saying why not."""
    if tree is not None:
        return _built(tree) or _raise(
            f"--llama-cpp {tree}: no {', '.join(TOOLS)} under bin/ or build/bin/ with "
            "convert_hf_to_gguf.py and gguf-py beside them")
    for src in sorted(cache_dir.glob("*/vendor/llama.cpp")):
        found = _built(src)
        if found:
            return found
    if not build:
        raise PeerUnavailable(f"no built llama.cpp in {cache_dir} and --no-build given "
                              "(pass --llama-cpp DIR)")
    return _build(cache_dir, jobs)


def _built(tree: Path) -> LlamaCpp | None:
    for bin_dir in (tree / "bin", tree / "build" / "bin"):
        if all((bin_dir / t).is_file() for t in TOOLS):
            src = next((d for d in (tree, bin_dir.parent, bin_dir.parent.parent)
                        if (d / "convert_hf_to_gguf.py").is_file() and (d / "gguf-py").is_dir()),
                       None)
            if src is not None:
                return LlamaCpp(bin_dir, src, _cmake_flags(bin_dir.parent / "CMakeCache.txt"))
    return None


def _cmake_flags(cache: Path) -> list[str]:
    """The build options that decide speed, as CMake recorded them. A native build (-march=native)
    ignores the per-instruction-set options (GGML_AVX2=OFF there says nothing): those are left
    out then."""
    if not cache.is_file():
        return []
    pattern = re.compile(r"^(CMAKE_BUILD_TYPE|GGML_(NATIVE|AMX\w*|AVX\w*|FMA|F16C|BMI2|OPENMP))"
                         r":\w+=(.*)$")
    flags = {m[1]: m[3] for m in map(pattern.match, cache.read_text().splitlines()) if m}
    native = flags.get("GGML_NATIVE") == "ON"
    return [f"{k}={v}" for k, v in flags.items()
            if not (native and k.startswith(("GGML_AVX", "GGML_FMA", "GGML_F16C", "GGML_BMI2")))]


def _build(cache_dir: Path, jobs: int) -> LlamaCpp:
    cache_dir.mkdir(parents=True, exist_ok=True)
    print(f"building llama.cpp from the {SDIST} sdist into {cache_dir} (many minutes)",
          flush=True)
    _check([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
            SDIST, "-d", str(cache_dir)], what=f"pip download {SDIST}")
    sdist = max(cache_dir.glob(f"{SDIST.replace('-', '_')}-*.tar.gz"), default=None)
    if sdist is None:
        raise PeerUnavailable(f"pip download {SDIST}: no sdist in {cache_dir}")
    _check(["tar", "xzf", str(sdist), "-C", str(cache_dir)], what=f"tar xzf {sdist.name}")
    src = cache_dir / sdist.name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
    _check(["cmake", "-S", str(src), "-B", str(src / "build"), *CMAKE_FLAGS], what="cmake")
    _check(["cmake", "--build", str(src / "build"), f"-j{jobs}", "--target", *TOOLS],
           what="cmake --build")
    return _built(src) or _raise(f"built {src} but {', '.join(TOOLS)} are not in build/bin")


def _check(cmd: list[str], what: str, env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as err:
        raise PeerUnavailable(f"{what}: {err}") from None
    if res.returncode:
        raise PeerUnavailable(f"{what} exited {res.returncode}: {failure_line(res.stderr or res.stdout)}")
    return res


def failure_line(output: str | None) -> str:
    """The line of a failed tool's output that says why: its last exception line
    ("ValueError: ..."), else its last line (warnings printed at exit come after the error)."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
    return (errors or lines or ["no output"])[-1]


def _raise(message: str):
    raise PeerUnavailable(message)
