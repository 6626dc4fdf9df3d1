"""The text normalisation of the ASR round trip (``kztts.eval.asr``): what a word or a character is
before WER / CER are counted. Pure Python; both the prompt text and the transcript go through it.

Per utterance, in this order:

1. **Unicode and case.** NFKC (full-width letters, digits and punctuation become their plain forms,
   ligatures split), then ``str.casefold`` (case never counts). Accents are kept: in French they
   tell words apart (``a`` / ``à``).
2. **Numbers.** Digits are written out as the words a reader would say, in the utterance's language,
   so "7" and "seven" are the same word: integers (English thousands separators ``1,000`` dropped),
   decimals (``3.5`` -> "three point five"; French ``3,5`` -> "trois virgule cinq") and a trailing
   percent sign (``50%`` -> "fifty percent" / "cinquante pour cent" / 百分之五十). English and French
   cardinals in full (French with ``et un`` for 21..71, ``quatre-vingts``, plural ``cents``); Chinese
   with 十 百 千 万 亿 and 零 for inner zeros (102 -> 一百零二, 12 -> 十二), except four digits
   before 年, a year, read digit by digit (2026年 -> 二零二六年). Ordinals ("1st") keep their
   suffix after the number words ("one st"), on both sides alike.
3. **Punctuation.** Every Unicode punctuation and symbol character becomes a space, hyphens included
   ("twenty-one" = "twenty one"). The apostrophe is removed inside English words ("don't" ->
   "dont", one word as written), and is a word break in French, where it marks an elision
   ("l'homme" -> "l homme").
4. **Units.** English and French: words, split on whitespace (WER). Chinese: characters, all
   whitespace removed (CER); Latin letters inside Chinese text count one unit each too.

A text with no unit left after this cannot be scored: :func:`units` raises ``ValueError``.
"""
from __future__ import annotations

import re
import unicodedata

# the kztts language names the round trip judges, and whether its unit is a word or a character
WORD_LANGUAGES = ("english", "french")
CHARACTER_LANGUAGES = ("chinese",)
LANGUAGES = WORD_LANGUAGES + CHARACTER_LANGUAGES

_EN_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
            "sixteen seventeen eighteen nineteen").split()
_EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_EN_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))

_FR_ONES = ("zéro un deux trois quatre cinq six sept huit neuf dix onze douze treize quatorze quinze seize "
            "dix-sept dix-huit dix-neuf").split()
_FR_TENS = "_ _ vingt trente quarante cinquante soixante".split()

_ZH_DIGITS = "零一二三四五六七八九"
_ZH_SMALL = ((1000, "千"), (100, "百"), (10, "十"))
_ZH_BIG = ((10**8, "亿"), (10**4, "万"))

_MAX_NUMBER = 10**15  # beyond this a digit string is read digit by digit (an identifier, not a quantity)


def english_number(n: int) -> str:
    """English cardinal words of ``n`` >= 0 ("twenty one", "one hundred five"; no "and")."""
    if n < 20:
        return _EN_ONES[n]
    if n < 100:
        return _EN_TENS[n // 10] + ("" if n % 10 == 0 else " " + _EN_ONES[n % 10])
    if n < 1000:
        return _EN_ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + english_number(n % 100))
    for scale, word in _EN_SCALES:
        if n >= scale:
            rest = n % scale
            return f"{english_number(n // scale)} {word}" + ("" if rest == 0 else " " + english_number(rest))
    raise AssertionError(n)


def _fr_below_100(n: int) -> str:
    if n < 20:
        return _FR_ONES[n]
    tens, ones = divmod(n, 10)
    if tens in (7, 9):  # soixante-dix..., quatre-vingt-dix...: 60 / 80 plus 10..19
        base, rest = ("soixante", n - 60) if tens == 7 else ("quatre-vingt", n - 80)
        joiner = " et " if n == 71 else "-"
        return base + joiner + _FR_ONES[rest]
    if tens == 8:
        return "quatre-vingts" if ones == 0 else "quatre-vingt-" + _FR_ONES[ones]
    if ones == 0:
        return _FR_TENS[tens]
    return _FR_TENS[tens] + (" et un" if ones == 1 else "-" + _FR_ONES[ones])


def _fr_below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    if hundreds == 0:
        return _fr_below_100(rest)
    head = "cent" if hundreds == 1 else _FR_ONES[hundreds] + (" cents" if rest == 0 else " cent")
    return head if rest == 0 else head + " " + _fr_below_100(rest)


def french_number(n: int) -> str:
    """French cardinal words of ``n`` >= 0 (1990 rules: "vingt et un", "quatre-vingts", "deux cents")."""
    if n < 1000:
        return _fr_below_1000(n)
    if n < 10**6:
        thousands, rest = divmod(n, 1000)
        # "mille" takes no "un" and no plural, and "cents"/"vingts" lose their s before it
        head = "mille" if thousands == 1 else re.sub(r"(cent|vingt)s$", r"\1", _fr_below_1000(thousands)) + " mille"
        return head if rest == 0 else head + " " + _fr_below_1000(rest)
    for scale, word in ((10**12, "billion"), (10**9, "milliard"), (10**6, "million")):
        if n >= scale:
            count, rest = divmod(n, scale)
            head = f"{french_number(count)} {word}{'s' if count > 1 else ''}"
            return head if rest == 0 else head + " " + french_number(rest)
    raise AssertionError(n)


def _zh_below_10000(n: int) -> str:
    out, zero = [], False
    for scale, unit in _ZH_SMALL:
        d = n // scale % 10
        if d:
            if zero and out:
                out.append("零")
            out.append(_ZH_DIGITS[d] + unit)
            zero = False
        elif out:
            zero = True
    if n % 10:
        out.append(("零" if zero and out else "") + _ZH_DIGITS[n % 10])
    return "".join(out)


def chinese_number(n: int) -> str:
    """Chinese numerals of ``n`` >= 0 (102 -> 一百零二, 10 -> 十, 20000 -> 二万)."""
    if n == 0:
        return "零"
    out, pending_zero = "", False
    for scale, unit in _ZH_BIG + ((1, ""),):
        part = n // scale % 10**4 if scale != 10**8 else n // scale
        if part:
            if out and (pending_zero or part < 1000):
                out += "零"
            out += (chinese_number(part) if part >= 10**4 else _zh_below_10000(part)) + unit
            pending_zero = False
        elif out:
            pending_zero = True
    return out[1:] if out.startswith("一十") else out  # 12 -> 十二, as it is said


def _digits_only(digits: str, language: str) -> str:
    if language == "chinese":
        return "".join(_ZH_DIGITS[int(d)] for d in digits)
    words = _EN_ONES if language == "english" else _FR_ONES
    return " ".join(words[int(d)] for d in digits)


def _integer(digits: str, language: str) -> str:
    n = int(digits)
    if n >= _MAX_NUMBER:
        return _digits_only(digits, language)
    return {"english": english_number, "french": french_number, "chinese": chinese_number}[language](n)


_EN_NUMBER = re.compile(r"(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(\s*%)?")
_FR_NUMBER = re.compile(r"(\d+)(?:[.,](\d+))?(\s*%)?")
_ZH_YEAR = re.compile(r"(\d{4})(?=\s*年)")


def spell_numbers(text: str, language: str) -> str:
    """``text`` with every digit group written out in ``language`` (english, french, chinese)."""
    if language not in LANGUAGES:
        raise ValueError(f"no number reading for {language!r}; known: {', '.join(LANGUAGES)}")
    if language == "chinese":
        text = _ZH_YEAR.sub(lambda m: _digits_only(m.group(1), "chinese"), text)
    pattern = _EN_NUMBER if language == "english" else _FR_NUMBER
    point = {"english": " point ", "french": " virgule ", "chinese": "点"}[language]
    percent = {"english": " percent", "french": " pour cent"}

    def say(m: re.Match) -> str:
        words = _integer(m.group(1).replace(",", ""), language)
        if m.group(2):
            words += point + _digits_only(m.group(2), language)
        if m.group(3):
            words = "百分之" + words if language == "chinese" else words + percent[language]
        sep = "" if language == "chinese" else " "
        return sep + words + sep

    return pattern.sub(say, text)


def normalize(text: str, language: str) -> str:
    """``text`` normalised for scoring in ``language`` (module docstring: steps 1-3); units
    separated by single spaces (Chinese: no spaces at all)."""
    if language not in LANGUAGES:
        raise ValueError(f"no ASR normalisation for {language!r}; known: {', '.join(LANGUAGES)}")
    text = unicodedata.normalize("NFKC", text).casefold()
    text = spell_numbers(text, language)
    text = text.replace("\u2019", "'").replace("\u02bc", "'")  # typographic apostrophes (NFKC keeps them)
    text = re.sub(r"(?<=\w)'(?=\w)", "" if language == "english" else " ", text)
    text = "".join(" " if unicodedata.category(ch)[0] in "PSZC" else ch for ch in text)
    if language in CHARACTER_LANGUAGES:
        return "".join(text.split())
    return " ".join(text.split())


def units(text: str, language: str) -> list[str]:
    """The scored units of ``text``: words (English, French) or characters (Chinese)."""
    norm = normalize(text, language)
    out = list(norm) if language in CHARACTER_LANGUAGES else norm.split()
    if not out:
        raise ValueError(f"{text!r}: nothing left to score after normalisation ({language})")
    return out
