"""Engine configuration: KV pool sizing, batching limits, dtype and device."""

from __future__ import annotations

from dataclasses import dataclass

from graft.errors import GraftConfigError

_DTYPES = ("float32", "float16", "bfloat16")
# auto: the activations' dtype; int8: one fp32 scale per cached token and KV head
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "int8")
SPECULATIVE_MODES = ("off", "ngram", "suffix")


@dataclass
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int | None = None  # explicit KV pool size in blocks (wins over memory)
    kv_cache_memory: int | None = None  # KV pool size in bytes when num_kv_blocks is None
    max_num_seqs: int = 64  # most sequences running at once
    max_num_batched_tokens: int = 2048  # token budget of one step (prefill chunks + decodes)
    enable_prefix_caching: bool = True  # reuse KV of identical full prompt blocks
    dtype: str = "float32"  # weights and activations (and the KV cache unless kv_cache_dtype)
    kv_cache_dtype: str = "auto"  # auto (= dtype) | float32 | bfloat16 | int8
    device: str = "cpu"
    max_model_len: int | None = None  # context limit; default max_position_embeddings
    kv_cache_fraction: float = 0.9  # default pool: at most this share of free memory ...
    cpu_kv_cache_cap: int = 2 << 30  # ... and on CPU never above this many bytes
    enforce_eager: bool = False  # CUDA: no graphs; decode steps launch kernel by kernel
    seed: int = 0  # generator for sampled requests that give no seed of their own
    # how the LLM's linears are held: fp32 | bf16 | int8 | int4[-g32|-g64|-g128] for all, a
    # quantization config JSON path/dict per module (graft.serving.models.quantize), "none"
    # (the torch linears), or None: fp32 on the C kernels on CPU in fp32, else none
    quantization: str | dict | None = None
    # speculative decoding: off | ngram (prompt lookup over the sequence's own tokens) |
    # suffix (ngram, or continuations seen in recent requests' outputs when longer); a
    # request may override it (SamplingParams.speculative)
    speculative: str = "off"
    num_speculative_tokens: int = 4  # most proposed tokens verified per step and sequence
    ngram_min: int = 2  # shortest suffix n-gram looked up ...
    ngram_max: int = 4  # ... and the longest (tried first)
    suffix_cache_tokens: int = 1 << 16  # suffix mode: recent output tokens remembered

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens",
                     "num_speculative_tokens", "ngram_min", "ngram_max", "suffix_cache_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise GraftConfigError(f"EngineConfig.{name} must be a positive int, got {value!r}")
        for name in ("num_kv_blocks", "kv_cache_memory", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise GraftConfigError(
                    f"EngineConfig.{name} must be a positive int or None, got {value!r}")
        if self.speculative not in SPECULATIVE_MODES:
            raise GraftConfigError(f"EngineConfig.speculative must be one of {SPECULATIVE_MODES}, "
                                   f"got {self.speculative!r}")
        if self.ngram_min > self.ngram_max:
            raise GraftConfigError(f"EngineConfig.ngram_min={self.ngram_min} exceeds ngram_max="
                                   f"{self.ngram_max}; lower ngram_min or raise ngram_max")
        if self.dtype not in _DTYPES:
            raise GraftConfigError(f"EngineConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise GraftConfigError(f"EngineConfig.kv_cache_dtype must be one of "
                                   f"{KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.device.startswith("cuda") and self.kv_cache_dtype not in ("auto", self.dtype):
            raise GraftConfigError(
                f"EngineConfig.kv_cache_dtype={self.kv_cache_dtype!r}: on CUDA the KV cache has "
                "the activations' dtype (the Triton kernels read one dtype); use auto, or the "
                "CPU engine for a bf16/int8 cache")
        if self.quantization is not None:
            from graft.serving.models.quantize import QuantConfig

            QuantConfig.parse(self.quantization)  # a bad scheme or file fails here, before loading
        if not 0.0 < self.kv_cache_fraction <= 1.0:
            raise GraftConfigError(
                f"EngineConfig.kv_cache_fraction must be in (0, 1], got {self.kv_cache_fraction!r}")

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def kv_torch_dtype(self):
        import torch

        name = self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
        return getattr(torch, name)
