"""Inputs for make_official_cases.py: crafted answers that exercise each evaluator's quirks.

Punctuation, numbers as words, articles, contractions, whitespace, case, empty answers,
multi-sentence answers and unicode, per metric. The caption corpus for CIDEr-D is built
from pycocoevalcap's example/captions_val2014_fakecap_results.json when that file is given
(make_official_cases.py --fakecap), with human-style edits: capitals, periods, commas,
hyphens, possessives, contractions.
"""

from __future__ import annotations

import random

TEN = 10


def _mix(a: str, n_a: int, b: str) -> list[str]:
    return [a] * n_a + [b] * (TEN - n_a)


VQA_CASES = [
    ("red", ["red"] * TEN),
    ("Red", ["red"] * TEN),  # one distinct answer: no normalization in the official code
    ("Red", _mix("red", 9, "blue")),
    ("Two", ["2"] * TEN),
    ("two", _mix("2", 7, "3")),
    ("2.", _mix("2", 6, "two")),
    ("the dog", _mix("dog", 9, "a dog")),
    ("a dog", _mix("dog", 5, "cat")),
    ("therere", _mix("there're", 5, "there")),
    ("im", _mix("i'm", 5, "me")),
    ("Im", _mix("I'm", 5, "me")),
    ("dont", _mix("don't", 6, "no")),
    ("ive", _mix("i've", 4, "yes")),
    ("shed", _mix("she'd", 4, "shed")),
    ("yes, it is", _mix("yes it is", 5, "yes")),
    ("red,blue", ["red blue"] * TEN),
    ("red,blue", _mix("red blue", 5, "red")),
    ("red, blue", _mix("red blue", 5, "red")),
    ("1,000", _mix("1000", 5, "1,000")),
    ("1,,2", _mix("12", 5, "1 2")),
    ("3.5", _mix("3.5", 5, "35")),
    ("  red\n", _mix("red", 4, "blue")),
    ("red\tcar", _mix("red car", 5, "car")),
    ("", _mix("red", 5, "blue")),
    ("", _mix("", 3, "red")),
    ("It is red. The car is big.", ["red"] * TEN),
    ("It is red. The car is big.", _mix("it is red the car is big", 4, "red")),
    ("café", _mix("cafe", 5, "café")),
    ("\u0663", _mix("3", 5, "\u0663")),
    ("\uff32\uff45\uff44", _mix("red", 5, "\uff52\uff45\uff44")),
    ("one hundred", _mix("100", 5, "1 hundred")),
    ("none", _mix("0", 5, "none")),
    ("yes!", _mix("yes", 9, "no")),
    ("(yes)", _mix("yes", 8, "no")),
    ("hot-dog", _mix("hot dog", 5, "hotdog")),
    ("hot - dog", _mix("hot dog", 5, "hotdog")),
    ("e.g.", _mix("eg", 5, "e.g.")),
    ("many periods " + "." * 40, _mix("many periods", 5, "x")),
    ("50%", _mix("50%", 5, "50")),
    ("it's", _mix("it's", 5, "its")),
    ("whats", _mix("what's", 5, "what")),
    ("Let's go", _mix("let's go", 5, "lets go")),
    ("10", _mix("ten", 5, "10")),
    ("an apple", ["apple"] * 3 + ["an apple"] * 3 + ["the apple"] * 4),
    ("red", ["red", "red", "blue"]),
    ("yes/no", _mix("yes no", 5, "yesno")),
    ("bird's", _mix("birds", 5, "bird's")),
    ("2:30", _mix("230", 5, "2:30")),
    ("SEVEN", _mix("7", 4, "seven")),
    ("Yes. No.", _mix("yes no", 5, "yes")),
]

ANLS_CASES = [
    ("hello", ["hello"]), ("Hello", ["hello"]), ("helo", ["hello"]), ("ab", ["ac"]), ("abcd", ["abef"]),
    ("  paris ", ["paris"]), ("new  york", ["new york"]), ("new yrk", ["new  york"]), ("", ["abc"]),
    ("", [""]), ("   ", [""]), ("abc", ["xyz", "abd"]), ("straße", ["strasse"]), ("\ufb01le", ["file"]),
    ("\u0130stanbul", ["istanbul"]), ("12.5", ["12,5"]), ("$1,000", ["1000"]), ("The answer is 42", ["42"]),
    ("Paris. It is in France.", ["paris"]), ("PARIS", ["paris", "Paris, France"]), ("abc\ndef", ["abc def"]),
    ("a", ["b"]), ("ab", ["abc"]), ("abc", ["ab"]), ("abcdef", ["abc"]), ("abcdefg", ["abc"]),
    ("日本", ["日本語"]), ("naïve", ["naive"]), ("colour", ["color"]), ("5", ["five"]), ("yes", ["Yes", "no"]),
    ("hello world", ["hello", "world"]), ("x" * 10, ["x" * 20]), ("1/2", ["0.5"]), ("Ünïcödé", ["unicode"]),
    ("  ", ["a"]), ("ab  ", ["ab"]), ("a b", ["ab"]), ("\tab", ["ab"]), ("the cat", ["cat"]),
]

POPE_ANSWERS = [
    "Yes", "yes", "No", "no", "NO", "no.", "No, there is not.", "Yes. There is no cat in the picture.",
    "There is no cat.", "There is a cat, not a dog.", "not sure", "Not", "No!", "no!", "", " ",
    "Yes, there is a dog", "I don't think so", "No\nthere is", "no,", "Nope", "Absolutely not", "not.",
    "Yes, but not clearly.", "The answer is no", "noo", "Nothing", "Yes.No", "No there isn't", "no. yes",
    "3.5 no", "yes no", "No cat", "Yes\tno", "There is no dog", "Yes the cat is there not", "ño", "NO, no.",
    "Yes, no doubt", ". no", "no;", " no", "no ", "Yes, there is no", "It is not there",
]
POPE_SETS = [
    (["Yes", "yes, there is", "No.", "yes", "yes", "Yes", "There is not.", "no"], ["yes"] * 4 + ["no"] * 4),
    (["Yes. There is no cat in the picture.", "", "NO", "no!", "No, it is not.", "No", "not", "yes"],
     ["yes", "yes", "no", "no", "yes", "no", "yes", "no"]),
    (["No", "no", "No.", "not"], ["yes", "no", "yes", "no"]),  # no predicted yes: the script divides by 0
    ([" no", "no ", "Yes, no doubt", "There is a dog, not a cat.", "Yes", "yes"], ["no", "no", "yes", "no", "yes", "yes"]),
    (POPE_ANSWERS, ["yes", "no"] * (len(POPE_ANSWERS) // 2) + ["yes"] * (len(POPE_ANSWERS) % 2)),
]

_ABCD = {"A": "cat", "B": "dog", "C": "blue bird", "D": "fish"}
MC_CASES = [(p, _ABCD) for p in [
    "A", "B", "c", "(C) blue bird", "Answer: A", "d.", "It is a blue bird.", "Dog", "A or B", "no idea",
    "A square", "A small dog", "I think B is right", "I pick A", "The answer is C", "The correct answer is **D**.",
    "answer is b", "B. dog", "The answer is A because the cat sits on the mat", "Z",
    "Cannot determine the answer", "Failed to obtain answer via API", "", "  B  ", "[B]", "B)", "Option B",
    "B and C", "fish", "cat and dog", "It is a fish. A long explanation about the image that goes on and on.",
    "A. cat\nB. dog", "E", "b", "**B**", "B: dog", "D - fish", "I'm not sure, maybe B or maybe C",
    "The image shows a blue bird sitting.", "bird", "Blue Bird", "A cat.", "\U0001f600 B",
    "I can't process this file.", "Z. none",
]] + [
    ("red car", {"A": "red", "B": "green", "C": "red car"}),
    ("yes", {"A": "yes", "B": "no"}),
    ("2", {"A": "1", "B": "2", "C": "3", "D": "4"}),
    ("12", {"A": "1", "B": "2", "C": "3", "D": "4"}),
    ("anything", {"A": "", "B": "x"}),
    ("E", {"A": "a", "B": "b", "C": "c", "D": "d", "E": "e"}),
]

PTB_CAPTIONS = [
    "A black-and-white photo of a man's dog.", "Two people don't like it, they can't go.",
    '"Hello," she said (quietly) -- and left...', "The U.S. flag on a 3.5-inch pole at 10:30 a.m.",
    "A cat/dog on a table & a 1,000-piece puzzle!", "Isn't it   great?! Yes; it's fine: really.",
    "café naïve résumé — über “quoted” ‘single’ …", "It cost $5.00 or 5% more #hashtag @user *star* [box] {curly}",
    "A man cannot gonna wanna lemme gimme.", "He said 'hi' and ''bye'' ``ok``",
    "e-mail x-ray well-known 20-year-old t-shirt", "a 2x4 board, 1/2 cup, 3rd place, 90's music",
    "mr. smith and dr. jones vs. etc.", "Its 4pm. OK?", "emoji \U0001f600 test ½ ²",
    "wow!! really?? what?! no!? hmm.. wait.... yes!!!", "a - b word- -word co-op's o'clock",
    "it's. (a) 2-3 1990s 24/7 www.example.com e.g. i.e. st. ave.", "A dog's toy. Dogs' toys. She'll we'd they've I'm you're",
    "there are 2 dogs.The cat sat", "Tab\tseparated\twords here", "A man on a skate-board , with a frisbee .",
    "A kitchen with stainless steel appliances and granite counter tops", "hot-dog stand; people eat hot dogs: yum",
    "A 'cool' dog", "a man's hat's brim", "10.5 3,5 1.000.000 .5 5. -5", "a b.c d.e.f abc.def",
    "I'd've they'd've", "", "A  man   with   spaces", "A MAN IN CAPITALS ON A HORSE.",
    "A close-up of a red, white and blue kite.", "Two giraffes standing next to each other in a zoo.",
    "A woman's hand holding a cell-phone.", "The bus is parked; people are waiting.",
    "A plate with broccoli, carrots, and rice.", "A dog -- or maybe a wolf -- in the snow.",
    "y'all rock'n'roll 3:00pm J. Smith", "A sign that says \"STOP\" on a pole.",
    # harder than captions usually are: URLs, e-mail, emoticons, code names, units
    'Email me at john.doe@example.com or visit http://example.com/page?id=3',
    "A man's 2nd-floor apartment (with a view!) costs $1,200/month.",
    "It's 5 o'clock -- time for tea & cake :)",
    'The sign reads "NO PARKING" in red/white letters...',
    "She said: 'Don't go!' and he didn't.",
    'A dog--maybe a wolf--runs.',
    'A cat on a mat;a dog on a log',
    "Is this a 'real' photo? Who knows!?",
    "The year 2000's best photo, taken in the '90s.",
    'A 10x zoom on a 5\'6" man.',
    "Rock-'n'-roll fans at a café in São Paulo.",
    'C++ and C# code on a screen',
    'A 3-D movie poster with 100% stars',
    "He won't, can't, shouldn't've done it",
    'The "best" pizza in N.Y.C. is here.',
    'Two kids playing w/ a ball',
    'A plate of fish & chips, peas etc.',
    'An old-fashioned, black-and-white TV set.',
    'Look at the dog!!!Amazing.',
    'A shirt that says I ♥ NY',
    "It's 98.6°F outside – hot!",
    'A sign: "Stop" (in Spanish: "Alto")',
    'A man, a plan, a canal: Panama',
    'The U.N. building at 5 p.m. today',
    'A photo from Jan. 5, 2010',
    'A train at platform 9¾',
    'A table w/ 3 cups & 2 plates',
    "Mr. and Mrs. Smith's dog",
    'Nothing to see here...or is there?',
    'A sign with text #1 and *2*',
]


def caption_corpora(fakecap: list[str] | None) -> list[tuple[list[str], list[list[str]]]]:
    """(predictions, references per image) corpora; the first from the crafted captions."""
    crafted = ([c for c in PTB_CAPTIONS if c][:12],
               [[PTB_CAPTIONS[(i + k) % len(PTB_CAPTIONS)] or "a caption" for k in (13, 17, 23)] for i in range(12)])
    rest = [c for c in PTB_CAPTIONS[12:] if c]  # holds the captions CoreNLP splits differently
    tricky = (rest, [[rest[(i + k) % len(rest)] for k in (1, 2)] + [rest[i].lower()] for i in range(len(rest))])
    corpora = [crafted, tricky,
               (["a dog", "", "A cat on a mat."], [["a dog runs", "the dog"], ["a cat"], ["A cat sits on a mat."]])]
    if fakecap:
        rng = random.Random(0)
        n = min(len(fakecap) // 5, 100)
        corpora.append(([fakecap[5 * i] for i in range(n)],
                        [[_human_style(fakecap[5 * i + k], rng) for k in range(1, 5)] for i in range(n)]))
    return corpora


_EDITS = [("black and white", "black-and-white"), (" is ", " is, "), ("man ", "man's "), ("do not", "don't"),
          ("in front of", "in front-of"), ("next to", "next to,"), ("cell phone", "cell-phone"), (" and ", ", and ")]


def _human_style(caption: str, rng: random.Random) -> str:
    for old, new in _EDITS:
        if old in caption and rng.random() < 0.5:
            caption = caption.replace(old, new, 1)
    caption = caption[:1].upper() + caption[1:]
    return caption + ("." if rng.random() < 0.7 else "")
