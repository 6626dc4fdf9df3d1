"""A reply cut into the utterances it is spoken in: the same pieces however the text arrives."""
from __future__ import annotations

import random

import pytest

from kztts.assistant.reply_pieces import ReplyCutter, clean, reply_pieces

REPLY = ("Sure! A speech codec turns audio into codes. It keeps 3.5 kHz of detail, roughly.\n"
         "**Why** it matters: `codes` are small; you can send them anywhere. 你好。最后一句")


def test_whole_reply_pieces():
    assert reply_pieces(REPLY) == [
        "Sure!", "A speech codec turns audio into codes.", "It keeps 3.5 kHz of detail, roughly.",
        "Why it matters: codes are small; you can send them anywhere.", "你好。", "最后一句"]


@pytest.mark.parametrize("seed", range(20))
def test_incremental_pieces_equal_whole(seed):
    rng = random.Random(seed)
    cutter, got, i = ReplyCutter(), [], 0
    while i < len(REPLY):
        n = rng.randint(1, 6)
        got += cutter.feed(REPLY[i:i + n])
        i += n
    assert got + cutter.end() == reply_pieces(REPLY)


def test_an_end_waits_for_the_next_character():
    cutter = ReplyCutter()
    assert cutter.feed("It costs 3.") == []  # "3." could be "3.5"
    assert cutter.feed("5 euros. ") == ["It costs 3.5 euros."]
    assert cutter.end() == []


def test_long_pieces_end_at_a_clause_and_markup_is_not_spoken():
    words = " ".join(f"w{i}" for i in range(35))
    assert reply_pieces(f"{words}, and the rest.", max_words=30) == [f"{words},", "and the rest."]
    assert clean("** # ``") is None and clean("  a   *b*  ") == "a b"
    assert reply_pieces("```\n---\n```") == []


@pytest.mark.parametrize("seed", range(10))
def test_spoken_text_is_the_same_however_the_reply_is_cut(seed):
    from kztts.assistant.reply_pieces import SpokenText, spoken_text

    text = "  **Bold** and __under__ a_b `code`\n\n# Title  with   spaces ___ end.  "
    want = spoken_text(text)
    assert want == "Bold and under a_b code Title with spaces end."
    rng = random.Random(seed)
    cleaner, got, i = SpokenText(), "", 0
    while i < len(text):
        n = rng.randint(1, 5)
        got += cleaner.feed(text[i:i + n])
        i += n
    assert got + cleaner.end() == want and cleaner.speakable
    assert not SpokenText().speakable and spoken_text("``` --- ```") == "---"
