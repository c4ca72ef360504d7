"""Constrained decoding through llguidance: a JSON schema (or "any JSON object"), a regex, a
list of choices or a context-free grammar (Lark or GBNF) becomes a grammar, each guided
sequence owns a matcher, and each step masks the tokens the grammar does not allow before
anything is sampled."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import torch

from graft.errors import GraftConfigError
from graft.serving.engine.grammar_check import GrammarLimitError
from graft.serving.engine.grammar_worker import compiler, row_limit

ANY_OBJECT = {"type": "object"}  # guided_json=True: any JSON object (OpenAI's json_object)
_TEMPLATES = 256  # compiled matchers kept per engine (one per distinct grammar)


def json_grammar(guided_json: dict | bool) -> str:
    """The llguidance grammar for SamplingParams.guided_json, or GraftConfigError naming the
    field in one line (an unknown type, a bad regex, a dangling $ref; GrammarLimitError for a
    schema over a limit). Compiled and checked in a worker process (grammar_worker.py)."""
    return compiler().json_grammar(ANY_OBJECT if guided_json is True else guided_json)


def regex_grammar(pattern: str, field: str = "SamplingParams.guided_regex") -> str:
    """The grammar of a regex the whole output matches, or GraftConfigError naming `field`
    (the SamplingParams field the pattern came from)."""
    return compiler().regex_grammar(pattern, field)


def cfg_grammar(text: str) -> str:
    """The grammar of SamplingParams.guided_cfg (Lark or GBNF text), or GraftConfigError naming
    the field."""
    return compiler().cfg_grammar(text)


# what the regex crate (llguidance's) escapes: each choice stands for itself
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")


def choice_regex(choices: list[str]) -> str:
    """SamplingParams.guided_choice as a regex: exactly one of the strings."""
    return "(?:" + "|".join("".join("\\" + c if c in _REGEX_META else c for c in choice)
                            for choice in choices) + ")"


def _one_line(text: str) -> str:
    return " ".join(text.split())


class GrammarTokenizer:
    """The engine's tokenizer as llguidance sees it (built on the first guided request, about a
    second for a 150k vocabulary) and one compiled matcher per grammar, which each sequence
    copies. `prepare` builds both off the engine's thread; thread-safe."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: set[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's)
        self.eos = sorted(eos_token_ids) or None
        self._lltok = None
        self._lock = threading.Lock()  # the templates (held briefly: the engine thread reads)
        self._tok_lock = threading.Lock()  # building _lltok (a second)
        self._templates: OrderedDict[str, object] = OrderedDict()  # sha256(grammar) -> matcher

    def prepare(self, grammar: str):
        """The compiled matcher for `grammar` (kept; never advanced): building one takes
        10 ms to a second for a big schema, so the HTTP layer calls this on its own threads
        and the engine's thread only copies it."""
        key = hashlib.sha256(grammar.encode()).hexdigest()
        with self._lock:
            template = self._templates.get(key)
            if template is not None:
                self._templates.move_to_end(key)
                return template
        if not compiler().accepted(grammar):  # the in-process build must never see a grammar
            # that no worker process has compiled first (one that crashes llguidance)
            raise GraftConfigError("SamplingParams.guided_grammar was not checked by the grammar "
                                   "compiler; set guided_json and let SamplingParams build it")
        from llguidance import LLMatcher

        template = LLMatcher(self._llguidance_tokenizer(), grammar, log_level=0)
        if template.is_error():
            raise GraftConfigError(f"SamplingParams.guided_json cannot be matched with this "
                                   f"model's tokenizer: {_one_line(template.get_error())}")
        with self._lock:
            self._templates[key] = template
            while len(self._templates) > _TEMPLATES:
                self._templates.popitem(last=False)
        return template

    def matcher(self, grammar: str):
        """A fresh matcher for one sequence; GraftConfigError when it cannot be built."""
        return self.prepare(grammar).deep_copy()

    def _llguidance_tokenizer(self):
        with self._tok_lock:
            if self._lltok is None:
                import llguidance.hf
                from transformers import PreTrainedTokenizerFast

                if not isinstance(self.tokenizer, PreTrainedTokenizerFast):
                    raise GraftConfigError(
                        "SamplingParams.guided_json needs a fast (tokenizer.json) tokenizer; "
                        f"this model's is {type(self.tokenizer).__name__}")
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
    sequence stops). A parser row over llguidance's limit (a wide object the compile-time
    walk did not reach) is GrammarLimitError, this request's alone; any other token the mask
    did not allow is a bug, not a user error."""
    if not matcher.consume_token(token):
        limit = row_limit(matcher.get_error())
        if limit is not None:
            raise GrammarLimitError(f"SamplingParams.guided_json {limit}", "max_items_in_row")
        raise RuntimeError(f"guided decoding: token {token} was sampled outside the grammar "
                           f"({_one_line(matcher.get_error())})")
    return matcher.is_stopped()
