"""Constrained decoding through llguidance: a JSON schema (or "any JSON object") becomes a
grammar, each guided sequence owns a matcher, and each step masks the tokens the grammar
does not allow before anything is sampled."""

from __future__ import annotations

import json

import torch

from graft.errors import GraftConfigError

# No free whitespace between JSON tokens: with it a small model can pad with spaces or
# newlines until max_tokens and never close the object. The separators are json.dumps'
# defaults, so outputs read like Python's JSON. A schema's "x-guidance" key overrides these.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = {"type": "object"}  # guided_json=True: any JSON object (OpenAI's json_object)


def json_grammar(guided_json: dict | bool) -> str:
    """The llguidance grammar for SamplingParams.guided_json, or GraftConfigError naming the
    field with llguidance's reason in one line (an unknown type, a bad regex, a dangling $ref)."""
    from llguidance import LLMatcher

    schema = ANY_OBJECT if guided_json is True else guided_json
    try:
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except Exception as err:  # noqa: BLE001 - whatever llguidance cannot read is a bad schema
        raise GraftConfigError(f"SamplingParams.guided_json is not a usable JSON schema: "
                               f"{_one_line(str(err))}") from None
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise GraftConfigError(f"SamplingParams.guided_json is not a usable JSON schema: "
                               f"{_one_line(messages[0])}")
    return grammar


def _one_line(text: str) -> str:
    return " ".join(text.split())


class GrammarTokenizer:
    """The engine's tokenizer as llguidance sees it: built on the first guided request (about
    a second for a 150k vocabulary), then shared by every matcher."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's)
        self.eos = sorted(eos_token_ids) or None
        self._lltok = None

    def matcher(self, grammar: str):
        """A fresh matcher for one sequence; GraftConfigError when it cannot be built."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self._llguidance_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GraftConfigError(f"SamplingParams.guided_json cannot be matched with this "
                                   f"model's tokenizer: {_one_line(matcher.get_error())}")
        return matcher

    def _llguidance_tokenizer(self):
        if self._lltok is None:
            import llguidance.hf
            from transformers import PreTrainedTokenizerFast

            if not isinstance(self.tokenizer, PreTrainedTokenizerFast):
                raise GraftConfigError(
                    "SamplingParams.guided_json needs a fast (tokenizer.json) tokenizer; this "
                    f"model's is {type(self.tokenizer).__name__}")
            n_vocab = max(self.vocab_size, len(self.tokenizer))
            self._lltok = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=n_vocab,
                                                       eos_token=self.eos)
        return self._lltok


def allowed_tokens(matchers: list, vocab: int, device: torch.device) -> torch.Tensor:
    """[len(matchers), vocab] bool on `device`: the tokens each matcher's grammar allows next."""
    import llguidance.torch

    bitmask = llguidance.torch.allocate_token_bitmask(len(matchers), vocab)  # [n, ceil(V/32)]
    for i, matcher in enumerate(matchers):
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, i)
    # the packed mask crosses to the device (32x smaller), then unpacks there:
    # bit b of word w is token 32 w + b
    bits = torch.arange(32, dtype=torch.int32, device=device)
    allowed = (bitmask.to(device, non_blocking=True)[:, :, None] >> bits) & 1  # [n, W, 32]
    return allowed.flatten(1)[:, :vocab].bool()


def advance(matcher, token: int) -> bool:
    """Feed the sampled token to the matcher; True when the grammar is complete (the
    sequence stops). A token the mask did not allow is a bug, not a user error."""
    if not matcher.consume_token(token):
        raise RuntimeError(f"guided decoding: token {token} was sampled outside the grammar "
                           f"({_one_line(matcher.get_error())})")
    return matcher.is_stopped()
