"""Engine configuration: the one declaration of every engine option (KV pool sizing, batching
limits, dtype, device, weights, speculation). Each field carries its help and choices; the
command-line flags of every command and the serve YAML keys are derived from these fields
(graft.serving.engine.engine_args), and the Python API is this dataclass itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from graft.cli_types import torch_device
from graft.errors import GraftConfigError

DTYPES = ("float32", "bfloat16", "float16")
# a CPU step's cost is linear in its rows from ~128 on (the C tiles and oneDNN are FMA-bound),
# so a wave of prompts gains little from one big step: a server prefills it in turns of this
# many tokens and the first ones answer sooner (TTFT p50 about 0.6x on 16 chat prompts at once).
# Offline runs keep one step: turns cost an offline batch 2-4% of its tokens/s.
CPU_SERVE_PREFILL_TOKENS = 256
# auto: the activations' dtype; int8: one fp32 scale per cached token and KV head
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "int8")
SPECULATIVE_MODES = ("off", "ngram", "suffix")
LINEAR_DISPATCH_MODES = ("measure", "cached", "c", "torch")  # = graft.kernels.linear_dispatch.MODES
QUANTIZATION_HELP = ("weights of the LLM's linears: fp32 | bf16 | int8 | int8-g16/-g32 "
                     "(a scale per 16/32 columns: a GGUF's Q6_K/Q8_0) | int4 | "
                     "int4-g32/-g64/-g128, each int4 also with -a8 (inputs rounded to 8 bits, "
                     "as llama.cpp's Q4: faster on AVX2, not the dequantized model's numbers), "
                     "or a quant.json per module (graft quantize; one naming embed_tokens "
                     "holds the embedding table in a scheme too); none: the torch linears; "
                     "default: fp32 on the C kernels on CPU in fp32 (AVX2 and up), bf16 on "
                     "them in bf16 (AVX2, or AVX512-BF16 with or without AMX), else none")


def option(default, help: str, choices: tuple | None = None, **cli):
    """A dataclass field that is also a command-line flag and a serve YAML key. `cli` may set
    `flag` (the flag's own spelling), `metavar`, `parse` (the flag's argparse type), and for
    numbers `min` (default 1 for ints), `max` and `min_open` (min itself excluded)."""
    return field(default=default, metadata={"help": help, "choices": choices, **cli})


DECLARED = "_engine_options"  # Namespace attribute: the engine options a parser declared


def engine_values(args) -> dict:
    """{option: value} for the engine flags the parser declared (add_engine_args) that hold a
    value (None: not given, the dataclass default stands)."""
    values = {name: getattr(args, name) for name in getattr(args, DECLARED, ())}
    return {name: value for name, value in values.items() if value is not None}


@dataclass
class EngineConfig:
    block_size: int = option(16, "tokens per KV block")
    num_kv_blocks: int | None = option(
        None, "KV pool size in blocks (wins over --kv-cache-memory; default: sized from memory)")
    kv_cache_memory: int | None = option(
        None, "KV pool size in bytes when --num-kv-blocks is not given", metavar="BYTES")
    max_num_seqs: int = option(64, "most sequences running at once")
    max_num_batched_tokens: int = option(
        2048, "token budget of one step (prefill chunks + decodes)")
    max_prefill_tokens: int | None = option(
        None, "prompt tokens one step takes before it admits no more waiting requests; the prompt "
        "that crosses it still runs whole, up to --max-num-batched-tokens. Requests arriving "
        "together then get first tokens in turns, the first ones sooner (default: the step "
        f"budget; graft serve on CPU: {CPU_SERVE_PREFILL_TOKENS})")
    enable_prefix_caching: bool = option(True, "reuse the KV of identical full prompt "
                                         "blocks (--no-prefix-caching: never)",
                                         flag="--no-prefix-caching")
    dtype: str = option("float32", "weights and activations (and the KV cache unless "
                        "--kv-cache-dtype)", DTYPES)
    kv_cache_dtype: str = option("auto", "KV cache dtype: auto (= --dtype) | float32 | bfloat16 | "
                                 "int8 (a scale per token and head; CPU)", KV_CACHE_DTYPES)
    device: str = option("cpu", "torch device: cpu, cuda, cuda:1, ...", parse=torch_device)
    max_model_len: int | None = option(
        None, "context limit in tokens (default: the model's max_position_embeddings)")
    kv_cache_fraction: float = option(
        0.9, "default KV pool: at most this share of free memory (0 < F <= 1)",
        min=0.0, min_open=True, max=1.0)
    cpu_kv_cache_cap: int = option(2 << 30, "... and on CPU never above this many bytes",
                                   metavar="BYTES")
    enforce_eager: bool = option(False, "CUDA: no decode CUDA graphs (launch kernel by kernel)")
    seed: int = option(0, "generator seed for sampled requests that give no seed of their own",
                       min=0)
    # a scheme name, a quant.json path, the JSON as a dict, "none" (the torch linears), or None:
    # fp32 / bf16 on the C kernels on CPU in fp32 / bf16, else none (see
    # model_runner.default_quantization)
    quantization: str | dict | None = option(None, QUANTIZATION_HELP, metavar="SCHEME|quant.json")
    linear_dispatch: str | None = option(
        None, "CPU linears held in the C layout (quantized, or fp32 by default): which path runs "
        "a call of R rows, the C kernel or torch over the dequantized weight. measure = time "
        "both now for this model's shapes; cached = this machine's timings (~/.cache/graft/"
        "kernels), timing what is missing for up to 2 s per load; c | torch = always that path "
        "(default: $GRAFT_LINEAR_DISPATCH, else cached)", LINEAR_DISPATCH_MODES)
    speculative: str = option(
        "off", "speculative decoding default (a request may override it): ngram = prompt lookup "
        "over the request's own tokens; suffix = that, or what recent requests' outputs "
        "continued with; verified losslessly", SPECULATIVE_MODES)
    num_speculative_tokens: int = option(4, "most proposed tokens verified per step and request")
    ngram_min: int = option(2, "shortest n-gram looked up")
    ngram_max: int = option(4, "longest n-gram looked up (first)")
    suffix_cache_tokens: int = option(1 << 16, "suffix mode: recent output tokens remembered")
    # the parsed `quantization` (a QuantConfig, or None for none/unset): parsed here once
    quant_config: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens",
                     "num_speculative_tokens", "ngram_min", "ngram_max", "suffix_cache_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise GraftConfigError(f"EngineConfig.{name} must be a positive int, got {value!r}")
        for name in ("num_kv_blocks", "kv_cache_memory", "max_model_len", "max_prefill_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise GraftConfigError(
                    f"EngineConfig.{name} must be a positive int or None, got {value!r}")
        if self.linear_dispatch is not None and self.linear_dispatch not in LINEAR_DISPATCH_MODES:
            raise GraftConfigError(f"EngineConfig.linear_dispatch must be one of "
                                   f"{LINEAR_DISPATCH_MODES} or None, got {self.linear_dispatch!r}")
        for name, allowed in (("speculative", SPECULATIVE_MODES), ("dtype", DTYPES),
                              ("kv_cache_dtype", KV_CACHE_DTYPES)):
            if getattr(self, name) not in allowed:
                raise GraftConfigError(f"EngineConfig.{name} must be one of {allowed}, "
                                       f"got {getattr(self, name)!r}")
        if self.ngram_min > self.ngram_max:
            raise GraftConfigError(f"EngineConfig.ngram_min={self.ngram_min} exceeds ngram_max="
                                   f"{self.ngram_max}; lower ngram_min or raise ngram_max")
        if self.device.startswith("cuda") and self.kv_cache_dtype not in ("auto", self.dtype):
            raise GraftConfigError(
                f"EngineConfig.kv_cache_dtype={self.kv_cache_dtype!r}: on CUDA the KV cache has "
                "the activations' dtype (the Triton kernels read one dtype); use auto, or the "
                "CPU engine for a bf16/int8 cache")
        if self.quantization is not None:
            from graft.serving.models.quant_config import QuantConfig

            # a bad scheme or file fails here, before loading; the runner uses this parse
            self.quant_config = QuantConfig.parse(self.quantization)
        if not 0.0 < self.kv_cache_fraction <= 1.0:
            raise GraftConfigError(
                f"EngineConfig.kv_cache_fraction must be in (0, 1], got {self.kv_cache_fraction!r}")

    @classmethod
    def from_args(cls, args, **overrides) -> "EngineConfig":
        """The options a command's parser declared through `add_engine_args` (those left
        unset keep this dataclass's defaults), then `overrides` (what the command fixes)."""
        return cls(**{**engine_values(args), **overrides})

    @property
    def step_prefill_tokens(self) -> int:
        """Prompt tokens after which a step admits no more waiting requests (None given: the
        step budget, read here so that a config copied with another budget follows it)."""
        return self.max_prefill_tokens or self.max_num_batched_tokens

    @classmethod
    def for_serving(cls, **values) -> "EngineConfig":
        """The config of a server (graft serve, graft tune's replays): on CPU, prompts that
        arrive together are prefilled in turns of CPU_SERVE_PREFILL_TOKENS unless
        max_prefill_tokens is given. (A GPU gains from big steps: there the budget stands.)"""
        if values.get("max_prefill_tokens") is None and values.get("device", "cpu") == "cpu":
            values["max_prefill_tokens"] = CPU_SERVE_PREFILL_TOKENS
        return cls(**values)

    def to_dict(self) -> dict:
        """The options as given (what a results file records beside its numbers)."""
        from dataclasses import fields

        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def kv_torch_dtype(self):
        import torch

        name = self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
        return getattr(torch, name)
