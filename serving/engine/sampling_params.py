"""Per-request decoding settings, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graft.errors import GraftConfigError
from graft.serving.engine.config import SPECULATIVE_MODES

# the seeds a torch.Generator takes (int64 min .. uint64 max); outside them manual_seed raises
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1
# below this, temperature scaling overflows fp32 logits (1e-300 -> inf -> NaN): sample greedily
GREEDY_BELOW = 1e-5


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = all
    min_p: float = 0.0  # drop tokens less likely than min_p x the likeliest's probability
    max_tokens: int = 16  # most new tokens
    ignore_eos: bool = False  # keep going past the model's eos token(s)
    seed: int | None = None  # per-request generator: same seed, same tokens, any batch
    stop_token_ids: list[int] = field(default_factory=list)  # finish when one is sampled
    stop: list[str] | str | None = None  # finish when the text contains one (cut before it)
    include_stop_str_in_output: bool = False  # cut after the stop string instead (vLLM's)
    logprobs: int | None = None  # return this many top logprobs per token (plus the sampled)
    # this many top logprobs per prompt token (plus the prompt's own); no prefix-cache hits
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True  # for the decoded text
    speculative: str | None = None  # off | ngram | suffix for this request; None = the engine's
    # logits processors (serving/engine/logits_processors.py), OpenAI / vLLM semantics
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    presence_penalty: float = 0.0  # minus this for every token already in the output, [-2, 2]
    frequency_penalty: float = 0.0  # minus this times its count in the output, [-2, 2]
    repetition_penalty: float = 1.0  # > 1 discourages prompt + output tokens (HF, vLLM)
    min_tokens: int = 0  # eos, stop_token_ids and stop strings wait for this many tokens
    allowed_token_ids: list[int] | None = None  # vLLM's: sample only among these (None: all)
    # vLLM's bad_words, as token id sequences (the server tokenizes the words): a sequence's
    # last token is masked wherever the output ends with the ones before it
    bad_words_token_ids: list[list[int]] | None = None
    # constrained decoding (serving/engine/guided.py): True = any JSON object, a dict = a JSON
    # schema the output validates against, None (or False) = free text; never speculates
    guided_json: dict | bool | None = None
    guided_regex: str | None = None  # or: the whole output matches this regex
    guided_choice: list[str] | None = None  # or: the output is exactly one of these strings
    # or: a context-free grammar the output follows, Lark (llguidance's) or GBNF (llama.cpp's)
    guided_cfg: str | None = None
    # the grammar holds from the token after this one (a reasoning model's end of thinking,
    # `</think>`), free text before it; None: from the first token
    guided_after_token: int | None = None
    guided_grammar: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) \
                or self.max_tokens <= 0:
            raise GraftConfigError(
                f"SamplingParams.max_tokens must be a positive int, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise GraftConfigError(
                f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise GraftConfigError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise GraftConfigError(
                f"SamplingParams.top_k must be an int >= -1 (0/-1 = off), got {self.top_k!r}")
        if (not isinstance(self.min_p, (int, float)) or isinstance(self.min_p, bool)
                or not 0.0 <= self.min_p <= 1.0):
            raise GraftConfigError(f"SamplingParams.min_p must be in [0, 1], got {self.min_p!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise GraftConfigError(
                    f"SamplingParams.{name} must be None or an int >= 0, got {value!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not SEED_MIN <= self.seed <= SEED_MAX):
            raise GraftConfigError(
                f"SamplingParams.seed must be None or an int in [{SEED_MIN}, {SEED_MAX}], "
                f"got {self.seed!r}")
        if self.speculative is not None and self.speculative not in SPECULATIVE_MODES:
            raise GraftConfigError(f"SamplingParams.speculative must be None or one of "
                                   f"{SPECULATIVE_MODES}, got {self.speculative!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise GraftConfigError(f"SamplingParams.stop must hold non-empty strings, got {self.stop!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise GraftConfigError(
                f"SamplingParams.stop_token_ids must hold token ids >= 0, got {self.stop_token_ids!r}")
        self._check_processors()
        if self.guided_json is False:
            self.guided_json = None
        self._check_guided()
        after = self.guided_after_token
        if after is not None and (not isinstance(after, int) or isinstance(after, bool)
                                  or after < 0 or self.guided_grammar is None):
            raise GraftConfigError(f"SamplingParams.guided_after_token must be None or a token id "
                                   f">= 0 with a guided_* grammar set, got {after!r}")

    def _check_guided(self) -> None:
        """At most one of the guided_* fields, compiled to guided_grammar."""
        from graft.serving.engine import guided

        given = [name for name in ("guided_json", "guided_regex", "guided_choice", "guided_cfg")
                 if getattr(self, name) is not None]
        if len(given) > 1:
            raise GraftConfigError(f"SamplingParams.{given[1]} cannot go with {given[0]}: "
                                   "a request follows one grammar")
        if self.guided_json is not None:
            if not isinstance(self.guided_json, (dict, bool)):
                raise GraftConfigError(f"SamplingParams.guided_json must be None, True (any JSON "
                                       f"object) or a JSON schema dict, got "
                                       f"{type(self.guided_json).__name__}")
            self.guided_grammar = guided.json_grammar(self.guided_json)
        elif self.guided_regex is not None:
            if not isinstance(self.guided_regex, str) or not self.guided_regex:
                raise GraftConfigError(f"SamplingParams.guided_regex must be a non-empty "
                                       f"string, got {self.guided_regex!r}")
            self.guided_grammar = guided.regex_grammar(self.guided_regex)
        elif self.guided_choice is not None:
            choices = self.guided_choice
            if (not isinstance(choices, (list, tuple)) or not choices
                    or not all(isinstance(c, str) and c for c in choices)):
                raise GraftConfigError(f"SamplingParams.guided_choice must be a non-empty list "
                                       f"of non-empty strings, got {choices!r}")
            self.guided_grammar = guided.regex_grammar(guided.choice_regex(list(choices)),
                                                       "SamplingParams.guided_choice")
        elif self.guided_cfg is not None:
            if not isinstance(self.guided_cfg, str) or not self.guided_cfg.strip():
                raise GraftConfigError(f"SamplingParams.guided_cfg must be a non-empty grammar "
                                       f"text, got {self.guided_cfg!r}")
            self.guided_grammar = guided.cfg_grammar(self.guided_cfg)

    def _check_processors(self) -> None:
        bias = self.logit_bias
        if bias is not None and not isinstance(bias, dict):
            raise GraftConfigError(f"SamplingParams.logit_bias must be a dict token id -> bias, "
                                   f"got {type(bias).__name__}")
        for tid, value in (bias or {}).items():
            if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
                raise GraftConfigError(
                    f"SamplingParams.logit_bias keys must be token ids >= 0, got {tid!r}")
            if not _number(value) or not -100 <= value <= 100:
                raise GraftConfigError(f"SamplingParams.logit_bias[{tid}] must be a number in "
                                       f"[-100, 100], got {value!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not -2.0 <= value <= 2.0:
                raise GraftConfigError(f"SamplingParams.{name} must be in [-2, 2], got {value!r}")
        if not _number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise GraftConfigError(f"SamplingParams.repetition_penalty must be > 0 (1 = off), "
                                   f"got {self.repetition_penalty!r}")
        allowed = self.allowed_token_ids
        if allowed is not None and not (isinstance(allowed, list) and allowed
                                        and all(map(_token_id, allowed))):
            raise GraftConfigError(f"SamplingParams.allowed_token_ids must be a non-empty list of "
                                   f"token ids >= 0, got {allowed!r}")
        words = self.bad_words_token_ids
        if words is not None and not (isinstance(words, list) and all(
                isinstance(w, list) and w and all(map(_token_id, w)) for w in words)):
            raise GraftConfigError(f"SamplingParams.bad_words_token_ids must be a list of "
                                   f"non-empty lists of token ids >= 0, got {words!r}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) \
                or not 0 <= self.min_tokens <= self.max_tokens:
            raise GraftConfigError(f"SamplingParams.min_tokens must be an int in [0, max_tokens="
                                   f"{self.max_tokens}], got {self.min_tokens!r}")

    def check_vocab(self, vocab_size: int) -> None:
        """GraftConfigError when a token id named here is outside the model's vocabulary."""
        bad = [t for t in self.logit_bias or () if t >= vocab_size]
        if bad:
            raise GraftConfigError(f"SamplingParams.logit_bias names token id {bad[0]}, outside "
                                   f"the model's vocabulary [0, {vocab_size})")
        for name in ("stop_token_ids", "allowed_token_ids"):
            bad = [t for t in getattr(self, name) or () if t >= vocab_size]
            if bad:
                raise GraftConfigError(f"SamplingParams.{name} names token id {bad[0]}, "
                                       f"outside the model's vocabulary [0, {vocab_size})")
        if self.guided_after_token is not None and self.guided_after_token >= vocab_size:
            raise GraftConfigError(f"SamplingParams.guided_after_token {self.guided_after_token} "
                                   f"is outside the model's vocabulary [0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def _token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
