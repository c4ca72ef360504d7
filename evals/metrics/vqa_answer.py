"""VQA answer processing exactly as GT-Vision-Lab's evaluator does it, and lmms-eval's variant.

Source: GT-Vision-Lab/VQA, PythonEvaluationTools/vqaEvaluation/vqaEval.py (commit a013f00,
2021-03-11): processPunctuation, processDigitArticle and their tables, read under Python 3
(the file is Python 2, where `\\d` in these patterns matched ASCII digits only; Python 3 and
lmms-eval also match other Unicode digits, and so do we).
Variant: EvolvingLMMs-Lab/lmms-eval, lmms_eval/tasks/_task_utils/vqa_eval_metric.py
(EvalAIAnswerProcessor, commit 75571cf), which differs only in its comma pattern.
"""

from __future__ import annotations

import re

# The official table, entry for entry (keys with capitals or apostrophes can never match a
# lowercased, apostrophe-keeping word the way the official code looks them up; kept as data).
CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've",
    "hasnt": "hasn't", "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've",
    "hes": "he's", "howd": "how'd", "howll": "how'll", "hows": "how's", "Id've": "I'd've",
    "I'dve": "I'd've", "Im": "I'm", "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've",
    "it'dve": "it'd've", "itll": "it'll", "let's": "let's", "maam": "ma'am", "mightnt": "mightn't",
    "mightnt've": "mightn't've", "mightn'tve": "mightn't've", "mightve": "might've",
    "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't", "notve": "not've",
    "oclock": "o'clock", "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at", "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've",
    "she's": "she's", "shouldve": "should've", "shouldnt": "shouldn't", "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd", "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've", "somebodyll": "somebody'll", "somebodys": "somebody's",
    "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd",
    "somethingd've": "something'd've", "something'dve": "something'd've",
    "somethingll": "something'll", "thats": "that's", "thered": "there'd",
    "thered've": "there'd've", "there'dve": "there'd've", "therere": "there're", "theres": "there's",
    "theyd": "they'd", "theyd've": "they'd've", "they'dve": "they'd've", "theyll": "they'll",
    "theyre": "they're", "theyve": "they've", "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've",
    "we'dve": "we'd've", "weve": "we've", "werent": "weren't", "whatll": "what'll",
    "whatre": "what're", "whats": "what's", "whatve": "what've", "whens": "when's",
    "whered": "where'd", "wheres": "where's", "whereve": "where've", "whod": "who'd",
    "whod've": "who'd've", "who'dve": "who'd've", "wholl": "who'll", "whos": "who's",
    "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's", "wont": "won't",
    "wouldve": "would've", "wouldnt": "wouldn't", "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll", "y'allll": "y'all'll",
    "yall'd've": "y'all'd've", "y'alld've": "y'all'd've", "y'all'dve": "y'all'd've", "youd": "you'd",
    "youd've": "you'd've", "you'dve": "you'd've", "youll": "you'll", "youre": "you're",
    "youve": "you've",
}
MANUAL_MAP = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4",
              "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = ("a", "an", "the")
PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-",
         ">", "<", "@", "`", ",", "?", "!")
# "(?!<=" is the official pattern's typo for a lookbehind: it only requires that no digit follows
PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
# The official code passes re.UNICODE (= 32) where sub() takes `count`: at most 32 periods go
PERIOD_STRIP_COUNT = int(re.UNICODE)
COMMA_STRIP = {
    "gt-vision-lab": re.compile(r"(\d)(\,)(\d)"),
    "lmms-eval": re.compile(r"(?<=\d)(\,)+(?=\d)"),
}


def clean_whitespace(text: str) -> str:
    """Newlines and tabs to spaces, then strip: done to every answer before anything else."""
    return text.replace("\n", " ").replace("\t", " ").strip()


def process_punctuation(text: str, comma_strip: re.Pattern = COMMA_STRIP["gt-vision-lab"]) -> str:
    out = text
    # a mark next to a space (or any digit,digit in the answer) is deleted, otherwise it
    # becomes a space; the test always looks at the original text
    glued = comma_strip.search(text) is not None
    for p in PUNCT:
        if p + " " in text or " " + p in text or glued:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return PERIOD_STRIP.sub("", out, PERIOD_STRIP_COUNT)


def process_digit_article(text: str) -> str:
    words = [MANUAL_MAP.get(w, w) for w in text.lower().split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


def normalize_answer(text: str, definition: str = "gt-vision-lab") -> str:
    """Whitespace cleaning, punctuation and digit/article/contraction processing of one answer."""
    return process_digit_article(process_punctuation(clean_whitespace(text), COMMA_STRIP[definition]))
