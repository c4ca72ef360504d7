"""A pure-Python stand-in for the caption tokenization of pycocoevalcap (no Java).

pycocoevalcap 1.2 (salaniz/pycocoevalcap, tokenizer/ptbtokenizer.py) runs Stanford CoreNLP
3.4.1's PTBTokenizer with -preserveLines -lowerCase and then drops the tokens in
PUNCTUATIONS. This module reproduces that for caption-like text: lowercase; hyphenated
words, numbers (3.5, 1,000, 10:30, 1/2), acronyms and initials (u.s., a.m., j.), URLs and
e-mail addresses stay whole; clitics split ("don't" -> do n't, "man's" -> man 's, "cannot" ->
can not); brackets become -lrb- etc. and, because the removal list is upper-case while the
tokens were lowercased, they are kept as tokens, as in the original. 67 of 70 crafted
captions and all of 500 COCO-style ones tokenize as CoreNLP does (tests/evals/official; the
three that differ are listed in test_official_metrics.py and docs/evals.md).
"""

from __future__ import annotations

import re

# pycocoevalcap's list, as it is: "-LRB-" etc. never match the lowercased "-lrb-"
PUNCTUATIONS = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-",
                          ".", "?", "!", ",", ":", "-", "--", "...", ";"])
# what PTB3 escaping writes for these characters (quotes become `` and '', dropped above)
_ESCAPES = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-",
            '"': "''", "`": "`"}
_UNICODE = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'",
                          "\u2014": " -- ", "\u2013": " -- ", "\u2026": " ... ",
                          "\u00bd": " 1/2 ", "\u00bc": " 1/4 ", "\u00be": " 3/4 ", "\n": " ", "\t": " "})
_SPLIT_WORDS = {"cannot": ("can", "not"), "gonna": ("gon", "na"), "gotta": ("got", "ta"),
                "wanna": ("wan", "na"), "lemme": ("lem", "me"), "gimme": ("gim", "me")}
_ABBREVIATIONS = ("mr", "mrs", "ms", "dr", "st", "ave", "jr", "sr", "vs", "etc", "inc", "co", "corp",
                  "ltd", "prof", "mt", "ft", "jan", "feb", "aug", "sept", "oct", "nov", "dec")
# splits CoreNLP makes inside a word, done on the text before it is cut into tokens
_IN_WORD_SPLITS = [(re.compile(r"\by'all\b"), "y' all"), (re.compile(r"(\w)'n'(\w)"), r"\1 'n' \2"),
            (re.compile(r"(\d:\d\d)([ap]m)\b"), r"\1 \2"),  # 3:00pm -> 3:00 pm (but 4pm stays)
            (re.compile(r"(\w)(n't)\b"), r"\1 \2"),
            (re.compile(r"(\w)('(?:s|re|ve|ll|d|m))\b"), r"\1 \2"),
            (re.compile(r"(\w)s'(?=\s|$)"), r"\1s '")]
_TOKEN = re.compile(r"""
    (?:https?|ftp)://\S+?(?=[.,!?;:"')]*(?:\s|$))     # URLs and e-mail addresses stay whole
  | [\w.+-]+@\w[\w-]*(?:\.[\w-]+)+
  | (?:[a-z]\.)+(?!\w)                                # acronyms and initials: u.s.  a.m.  j.
  | \b(?:""" + "|".join(_ABBREVIATIONS) + r""")\.(?!\w)  # abbreviations that keep their period
  | n't | '(?:s|re|ve|ll|d|m)\b | 't(?=is\b|was\b) | 'n' | y'(?=\s)  # clitics split off above
  | '\d0s\b                                          # decades: '90s
  | (?:(?<!\S)[+-](?=\d))? (?:[#@](?=[^\W\d]))? (?:\.(?=\d))?  # signed numbers, .5, #tags, @names
    \w+(?:(?:[-./:]|(?<=[^\W\d])'(?=[^\W\d])|(?<=\d),(?=\d))\w+)*  # words, 3.5, 1,000, well-known
  | \.{2,} | [!?]+ | -{2,}                           # punctuation runs are one token
  | \S                                               # any other mark alone
""", re.VERBOSE)


def ptb_tokenize(caption: str | None) -> list[str]:
    """The tokens pycocoevalcap's PTBTokenizer (then its punctuation filter) makes of a caption."""
    text = "".join(c for c in str(caption or "") if ord(c) <= 0xFFFF)  # CoreNLP drops astral symbols
    text = text.translate(_UNICODE).lower()
    for pattern, repl in _IN_WORD_SPLITS:
        text = pattern.sub(repl, text)
    tokens: list[str] = []
    for tok in _TOKEN.findall(text):
        tok = _ESCAPES.get(tok, tok)
        tokens.extend(_SPLIT_WORDS.get(tok, (tok,)))
    # CoreNLP writes any run of periods as "." tokens or "...": all of them are dropped
    return [t for t in tokens if t not in PUNCTUATIONS and t.strip(".")]
