"""Answer normalizers: a plain one for exact match and the EvalAI one used by VQAv2."""

from __future__ import annotations

import re
import string

_ARTICLES = {"a", "an", "the"}
_PUNCT_TABLE = str.maketrans({c: " " for c in string.punctuation})


def normalize_text(text: str | None) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace ("The Red." -> "red")."""
    if text is None:
        return ""
    words = str(text).lower().translate(_PUNCT_TABLE).split()
    return " ".join(w for w in words if w not in _ARTICLES)


# --- EvalAI (VQAv2) answer processing -------------------------------------------------
# The official evaluator writes number words as digits, drops articles, expands
# apostrophe-less contractions and strips punctuation unless it sits inside a number.
_NUMBER_WORDS = {
    "none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4",
    "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
}
_CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've",
    "couldnt": "couldn't", "didnt": "didn't", "doesnt": "doesn't", "dont": "don't",
    "hadnt": "hadn't", "hasnt": "hasn't", "havent": "haven't", "hed": "he'd",
    "hes": "he's", "howd": "how'd", "howll": "how'll", "hows": "how's", "Im": "I'm",
    "im": "i'm", "ive": "i've", "isnt": "isn't", "itd": "it'd", "itll": "it'll",
    "lets": "let's", "maam": "ma'am", "mightnt": "mightn't", "mightve": "might've",
    "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've",
    "oclock": "o'clock", "shant": "shan't", "shed": "she'd", "shes": "she's",
    "shouldve": "should've", "shouldnt": "shouldn't", "somebodys": "somebody's",
    "someones": "someone's", "somethings": "something's", "thats": "that's",
    "thered": "there'd", "theres": "there's", "theyd": "they'd", "theyll": "they'll",
    "theyre": "they're", "theyve": "they've", "twas": "'twas", "wasnt": "wasn't",
    "weve": "we've", "werent": "weren't", "whatll": "what'll", "whatre": "what're",
    "whats": "what's", "whatve": "what've", "whens": "when's", "whered": "where'd",
    "wheres": "where's", "whereve": "where've", "whod": "who'd", "wholl": "who'll",
    "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're",
    "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't",
    "yall": "y'all", "youd": "you'd", "youll": "you'll", "youre": "you're",
    "youve": "you've",
}
_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-",
          ">", "<", "@", "`", ",", "?", "!"]
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")


def _evalai_punctuation(text: str) -> str:
    out = text
    for p in _PUNCT:
        # a mark glued between words is removed, otherwise it becomes a space
        if (p + " " in text or " " + p in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out)


def _evalai_digits_articles(text: str) -> str:
    words = []
    for word in text.lower().split():
        word = _NUMBER_WORDS.get(word, word)
        if word not in _ARTICLES:
            words.append(_CONTRACTIONS.get(word, word))
    return " ".join(words)


def normalize_vqa(text: str | None) -> str:
    """EvalAI normalization of a VQAv2 answer (prediction or ground truth)."""
    if text is None:
        return ""
    text = str(text).replace("\n", " ").replace("\t", " ").strip().lower()
    return _evalai_digits_articles(_evalai_punctuation(text))
