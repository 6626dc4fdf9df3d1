"""How long a text is expected to take to speak, and the frame cap that follows from it.

``expected_seconds(text, language)`` counts syllables and divides by a typical speaking rate. Rates are
the mean syllable rates of read speech measured by Pellegrino, Coupé & Marsico, "A cross-language
perspective on speech information rate", *Language* 87(3), 2011 (Table 1, syllables/s): English 6.19,
French 7.18, German 5.97, Italian 6.99, Japanese 7.84 (morae/s), Mandarin 5.18, Spanish 7.82.
Languages the study did not measure (Korean, Russian, Portuguese, ...) take the mean of those seven,
6.74. Syllables are counted from the text: one per CJK ideograph in Chinese; in Japanese one mora per
kana (the small ゃゅょ that merge into the previous mora excluded) and two per kanji (the typical
on-reading, e.g. 学 ga-ku); one per Hangul block; in alphabetic scripts one per run of vowel letters (a
rough but language-neutral count: English silent "e" over-counts, Italian hiatus under-counts, by
~15%), one per digit. The estimate excludes pauses.

``runaway_frames(text, language)``: the frames an utterance may run to when the caller sets no
``max_frames``. A model can fail to stop (emit no end of speech); without a cap it would run to the
checkpoint's limit (minutes of audio). Healthy speech lies within 0.65..1.6x the expected duration
(``kztts.eval.quality.DURATION_BAND``: the study's speaker-to-speaker spread of about +-25% plus
pauses at punctuation), so the cap is ``RUNAWAY_FACTOR`` = 3x the expected seconds, nearly twice the
band's top, and at least ``RUNAWAY_FLOOR_SECONDS`` = 3 s, since a short text (one word) may open and
close with pauses longer than its speech.
"""
from __future__ import annotations

import math
import re
import unicodedata

# Syllables (Japanese: morae) per second of read speech, Pellegrino et al. 2011, Table 1.
SYLLABLE_RATES = {"english": 6.19, "french": 7.18, "german": 5.97, "italian": 6.99, "japanese": 7.84,
                  "chinese": 5.18, "spanish": 7.82}
DEFAULT_SYLLABLE_RATE = 6.74  # the mean of the seven above
RUNAWAY_FACTOR = 3.0
RUNAWAY_FLOOR_SECONDS = 3.0
FRAMES_PER_SECOND = 12.5  # the 12 Hz codec: 1920 samples at 24 kHz per frame

_VOWEL_RUN = re.compile(r"[aeiouyàáâãäåæèéêëìíîïòóôõöøùúûüýÿœąęėįųıаеёиоуыэюяіїєўɑəɛɪʊ]+", re.IGNORECASE)
_SMALL_KANA = set("ゃゅょャュョぁぃぅぇぉァィゥェォゎヮ")


def language_of(text: str, language: str | None) -> str:
    """The manifest language name, or for None/"auto" one guessed from the text's scripts."""
    name = (language or "auto").lower()
    if name != "auto":
        return name
    scripts = {unicodedata.name(ch, "").split(" ")[0] for ch in text if ord(ch) >= 0x3000 and ch.isalpha()}
    if scripts & {"HIRAGANA", "KATAKANA"}:
        return "japanese"
    if "HANGUL" in scripts:
        return "korean"
    if "CJK" in scripts:
        return "chinese"
    return "auto"


def syllables(text: str, language: str | None = None) -> int:
    """Syllables (Japanese: morae) ``text`` is expected to be spoken in (counting rule in the module doc)."""
    lang = language_of(text, language)
    count = 0
    for ch in text:
        if ord(ch) < 0x3000 or not ch.isalpha():
            continue
        script = unicodedata.name(ch, "")
        if script.startswith(("HIRAGANA", "KATAKANA")):
            count += 0 if ch in _SMALL_KANA else 1
        elif script.startswith("CJK UNIFIED"):
            count += 2 if lang == "japanese" else 1
        elif script.startswith("HANGUL"):
            count += 1
    # alphabetic words: one syllable per run of vowel letters; digits one each
    rest = "".join(ch if ord(ch) < 0x3000 else " " for ch in text)
    count += len(_VOWEL_RUN.findall(rest)) + sum(ch.isdigit() for ch in rest)
    return count


def expected_seconds(text: str, language: str | None = None) -> float:
    """Seconds of speech ``text`` typically takes in ``language`` (None/"auto": guessed from its script)."""
    lang = language_of(text, language)
    return syllables(text, lang) / SYLLABLE_RATES.get(lang, DEFAULT_SYLLABLE_RATE)


def runaway_frames(text: str, language: str | None = None) -> int:
    """The frame cap of an utterance whose caller set none (module docstring)."""
    seconds = max(RUNAWAY_FACTOR * expected_seconds(text, language), RUNAWAY_FLOOR_SECONDS)
    return math.ceil(seconds * FRAMES_PER_SECOND)
