"""Text longer than one Talker context: split at sentence/clause boundaries (``kztts.tts.text.split``), each
piece spoken as its own synthesis would be, the audio joined without clicks (``kztts.tts.audio_join``), and
a limit that cuts a piece's speech said on stderr and in the result, never silently."""
from __future__ import annotations

import logging
import random
import re

import numpy as np
import pytest

from kztts.tts.audio_join import PieceJoiner, join_pieces
from kztts.tts.text.split import frames_per_token, split_text

from support import run_kztts

ENGLISH = """The morning train was late again, and the platform filled with people who had somewhere else to be.
A woman in a green coat read the timetable twice; she did not believe it either time.

Nobody spoke for a while. Then a boy asked his father why trains are always late on Mondays, and the father,
who had no good answer, said that Mondays are heavy and trains are tired! Everyone laughed, even the woman in green.

When the train finally came, it was nearly empty. The doors opened with a sigh — as if the train, too, had
somewhere else to be. Was it worth the wait? Perhaps. The coffee in the dining car was excellent."""

CHINESE = """今天早上的火车又晚点了，站台上挤满了要去别处的人。一位穿绿色外套的女士把时刻表读了两遍；她两次都不相信。

很长时间没有人说话。后来一个男孩问他的父亲，为什么星期一的火车总是晚点？父亲想了想，说星期一很重，火车也累了！大家都笑了。

火车终于来了，车厢里几乎没有人。车门叹了一口气打开了，好像火车也有别的地方要去。等待值得吗？也许吧。餐车里的咖啡很好喝。"""


def _same_text(pieces: list[str], text: str) -> bool:
    return re.sub(r"\s+", "", "".join(pieces)) == re.sub(r"\s+", "", text)


# ------------------------------------------------------------------ splitter (no model)
def _words(s: str) -> int:
    return len(s.split())


LATIN = {  # language -> (text, sentences): each sentence alone fits a limit of 8 words, two do not
    "english": ("Where are you going? I am going home. It is late, and I am tired! See you tomorrow…",
                ["Where are you going?", "I am going home.", "It is late, and I am tired!", "See you tomorrow…"]),
    "german": ("Wohin gehst du? Ich gehe nach Hause. Es ist spät, und ich bin müde! Bis morgen.",
               ["Wohin gehst du?", "Ich gehe nach Hause.", "Es ist spät, und ich bin müde!", "Bis morgen."]),
    "french": ("Où vas-tu ? Je rentre à la maison. Il est tard, et je suis fatigué ! À demain.",
               ["Où vas-tu ?", "Je rentre à la maison.", "Il est tard, et je suis fatigué !", "À demain."]),
    "spanish": ("¿Adónde vas? Me voy a casa. Es tarde, y estoy cansado! ¡Hasta mañana!",
                ["¿Adónde vas?", "Me voy a casa.", "Es tarde, y estoy cansado!", "¡Hasta mañana!"]),
    "portuguese": ("Aonde você vai? Vou para casa. Está tarde, e estou cansado! Até amanhã.",
                   ["Aonde você vai?", "Vou para casa.", "Está tarde, e estou cansado!", "Até amanhã."]),
    "italian": ("Dove vai? Vado a casa. È tardi, e sono stanco! A domani.",
                ["Dove vai?", "Vado a casa.", "È tardi, e sono stanco!", "A domani."]),
    "russian": ("Куда ты идёшь? Я иду домой. Уже поздно, и я устал! До завтра.",
                ["Куда ты идёшь?", "Я иду домой.", "Уже поздно, и я устал!", "До завтра."]),
    "korean": ("어디 가세요? 집에 가요. 늦었고, 피곤해요! 내일 봐요.",
               ["어디 가세요?", "집에 가요.", "늦었고, 피곤해요!", "내일 봐요."]),
}


@pytest.mark.parametrize("language", sorted(LATIN))
def test_spaced_languages_split_at_sentence_ends(language):
    text, sentences = LATIN[language]
    limit = max(map(_words, sentences))  # a sentence fits, two of the longest do not
    pieces = split_text(text, limit, _words)
    assert _same_text(pieces, text) and all(_words(p) <= limit for p in pieces)
    # pieces are whole sentences, packed greedily
    assert len(pieces) > 1 and all(any(p.endswith(s) for s in sentences) for p in pieces), pieces


@pytest.mark.parametrize("text, sentences", [
    ("今天天气很好。我们去公园吧！你觉得怎么样？好的。", ["今天天气很好。", "我们去公园吧！", "你觉得怎么样？", "好的。"]),
    ("今日はいい天気です。公園に行きましょう！どう思いますか？はい。",
     ["今日はいい天気です。", "公園に行きましょう！", "どう思いますか？", "はい。"]),
    ("全角の感嘆符！全角の疑問符？半角の句点｡終わり．", ["全角の感嘆符！", "全角の疑問符？", "半角の句点｡", "終わり．"]),
], ids=["chinese", "japanese", "fullwidth"])
def test_cjk_splits_at_its_sentence_ends_without_spaces(text, sentences):
    pieces = split_text(text, max(map(len, sentences)), len)
    assert _same_text(pieces, text) and all(len(p) <= max(map(len, sentences)) for p in pieces)
    assert all(any(p.endswith(s) for s in sentences) for p in pieces), pieces


def test_a_long_sentence_is_cut_at_clauses_then_words_then_characters():
    text = "One two three, four five six; seven eight: nine ten — eleven twelve thirteen fourteen fifteen."
    pieces = split_text(text, 3, _words)
    assert pieces == ["One two three,", "four five six;", "seven eight:", "nine ten —",
                      "eleven twelve thirteen", "fourteen fifteen."]
    assert split_text("我们去公园，带上水、面包和水果；还有相机：好吗", 6, len) == \
        ["我们去公园，", "带上水、", "面包和水果；", "还有相机：", "好吗"]
    assert split_text("没有标点的一段很长的中文句子", 4, len) == ["没有标点", "的一段很", "长的中文", "句子"]


def test_numbers_and_times_are_not_boundaries():
    text = "It costs 3.14 or 1,000 units at 10:30 today. Pay later."
    assert split_text(text, 9, _words) == ["It costs 3.14 or 1,000 units at 10:30 today.", "Pay later."]


def test_a_text_that_fits_is_one_piece():
    assert split_text("  Short text. Two sentences.  ", 10, _words) == ["Short text. Two sentences."]
    with pytest.raises(ValueError):
        split_text("x", 0, len)


def test_frames_per_token_follows_the_language_or_the_scripts():
    assert frames_per_token(None, CHINESE) == frames_per_token("Chinese", "x") == 6.0
    assert frames_per_token("auto", "こんにちは") == 6.0 and frames_per_token(None, "안녕") == 5.0
    assert frames_per_token("auto", ENGLISH) == frames_per_token("english", CHINESE) == 5.0
    # under auto the largest of the scripts present: a piece never expects more per token than its text
    assert frames_per_token(None, ENGLISH + " 北京") == 6.0


# ------------------------------------------------------------------ joining (no model)
def test_join_fades_the_inner_edges_and_streams_identically():
    sr = 24000
    rng = np.random.default_rng(0)
    pieces = [rng.uniform(-0.9, 0.9, n).astype(np.float32) for n in (5000, 3001, 4200)]
    whole = join_pieces(pieces, sr)
    fade, gap = 240, 1920
    assert whole.shape[0] == sum(p.shape[0] for p in pieces) + 2 * gap
    np.testing.assert_array_equal(whole[:5000 - fade], pieces[0][:5000 - fade])  # the text's start untouched
    np.testing.assert_array_equal(whole[-4200 + fade:], pieces[2][fade:])  # and its end
    assert not whole[5000:5000 + gap].any()
    # no edge jumps: the samples next to the silence are faded to near zero
    assert abs(whole[4999]) < 1e-3 and abs(whole[5000 + gap]) < 1e-3
    # chunked, as stream() feeds it, gives the same samples
    joiner, out = PieceJoiner(sr, 3), []
    for p in pieces:
        out += [joiner.push(c) for c in np.array_split(p, 7)] + [joiner.end_piece()]
    np.testing.assert_array_equal(np.concatenate(out), whole)


# ------------------------------------------------------------------ with the tiny model
def test_prompt_length_matches_the_built_prompt(small, small_voice):
    from kztts.core.audio import synthetic_voice
    from kztts.tts.prompt import prompt_length
    from kztts.tts.text.tokenizer import assistant_text

    def text_tokens(tokenizer, text):
        return len(tokenizer.text_body(tokenizer.encode(assistant_text(text))))

    icl = small.voice_from_reference(synthetic_voice(), 24000, "A reference sentence.")
    for v in (small_voice, icl):
        for language in (None, "english"):
            for streaming in (False, True):
                for text in ("Hi.", "A somewhat longer text to speak, with a clause."):
                    built = small.prompt(text, v, language=language, streaming_text=streaming).embeds.shape[0]
                    ref = small.tokenizer.ref_body(small.tokenizer.ref_ids(v.ref_text)) if v.icl else []
                    assert prompt_length(text_tokens(small.tokenizer, text), language=language is not None,
                                         speaker=True, mode="icl" if v.icl else "xvector", non_streaming=not streaming,
                                         ref_text_tokens=len(ref),
                                         ref_frames=v.ref_codes.shape[0] if v.icl else 0) == built


@pytest.mark.parametrize("text, language", [(ENGLISH, "english"), (CHINESE, "chinese")], ids=["english", "chinese"])
def test_paragraphs_are_pieces_each_equal_to_its_own_synthesis(small, small_voice, text, language, caplog):
    kw = dict(language=language, greedy=True, max_frames=4)
    with caplog.at_level(logging.WARNING, logger="kztts.tts.tts"):
        result = small.synthesize(text, small_voice, **kw)
    pieces = result.pieces
    assert len(pieces) >= 3 and _same_text([p.text for p in pieces], text)
    assert result.frames == sum(p.frames for p in pieces) == 4 * len(pieces)
    alone = [small.synthesize(p.text, small_voice, **kw) for p in pieces]
    assert all(len(a.pieces) == 1 for a in alone)  # each piece fits: it is one synthesis
    np.testing.assert_array_equal(result.codes, np.concatenate([a.codes for a in alone]))
    np.testing.assert_array_equal(result.samples, join_pieces([a.samples for a in alone], small.sample_rate))
    # max_frames=4 stops every piece before its end of speech: said once per piece, and in the summary
    summary = result.summary()
    assert summary["pieces"] == len(pieces) and summary["truncated"] and len(summary["limits"]) == len(pieces)
    warned = [r.message for r in caplog.records if "before its end of speech" in r.message]
    assert warned[:len(pieces)] == summary["limits"] and "piece 2/" in warned[1] and "max_frames=4" in warned[1]
    # streamed piece by piece: the same codes, the same joined audio
    holder: dict = {}
    chunks = list(small.stream(text, small_voice, chunk_frames=3, result=holder, **kw))
    np.testing.assert_array_equal(holder["result"].codes, result.codes)
    np.testing.assert_allclose(np.concatenate(chunks), result.samples, atol=1e-5, rtol=0)
    assert [p.text for p in holder["result"].pieces] == [p.text for p in pieces]
    piped = list(small.stream(text, small_voice, chunk_frames=3, pipeline=True, **kw))  # decoded on a thread
    np.testing.assert_array_equal(np.concatenate(piped), np.concatenate(chunks))


def test_sampled_pieces_use_the_same_seed_each(small, small_voice):
    """The documented seed rule: every piece is sampled from ``seed``, as its own synthesis would be."""
    result = small.synthesize(ENGLISH, small_voice, language="english", seed=9, max_frames=3)
    assert len(result.pieces) > 1
    again = small.synthesize(ENGLISH, small_voice, language="english", seed=9, max_frames=3)
    np.testing.assert_array_equal(again.codes, result.codes)
    second = small.synthesize(result.pieces[1].text, small_voice, language="english", seed=9, max_frames=3)
    start = result.pieces[0].frames
    np.testing.assert_array_equal(result.codes[start:start + second.frames], second.codes)


def test_a_piece_cut_by_the_context_is_reported(small, small_voice, caplog):
    """With a max_frames past the 64-position context the tiny model (which never stops by itself) speaks
    on until the context is full, and says so (without one, the runaway cap would stop it first)."""
    with caplog.at_level(logging.WARNING, logger="kztts.tts.tts"):
        result = small.synthesize("Hello there.", small_voice, greedy=True, max_frames=500)
    assert len(result.pieces) == 1 and not result.stopped_by_eos
    assert result.limits and "context of 64 positions" in result.limits[0]
    assert result.limits[0] in caplog.text


def test_twenty_thousand_characters_lose_no_text(equal_bundle, tmp_path):
    from kztts.tts.tts import TTS

    words = "the quick brown fox jumps over a lazy dog while seven people watch quietly".split()
    rng = random.Random(0)
    sentences = []
    while sum(map(len, sentences)) < 20000:
        sentences.append(" ".join(rng.choice(words) for _ in range(rng.randint(6, 18))).capitalize()
                         + rng.choice(".!?,"))
    text = " ".join(sentences)[:20000]
    tts = TTS(equal_bundle)  # the default context of 4096
    pieces = tts.pieces(text, tts.voice_from_xvector(_xvector(tts, tmp_path)))
    assert len(pieces) > 1 and _same_text(pieces, text)
    # the CLI with a per-utterance cap: the whole text fits one prompt, the cap binds and is said
    out = tmp_path / "long.wav"
    res = run_kztts("synth", text, "-o", out, "--bundle", equal_bundle, "--xvector", _xvector(tts, tmp_path),
                    "--max-frames", 3)
    assert res.returncode == 0, res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if "before its end of speech" in ln]
    assert len(warnings) == 1 and "max_frames=3" in warnings[0], res.stderr
    assert "cut short by a limit" in res.stdout


def _xvector(tts, tmp_path):
    path = tmp_path / "voice.npy"
    if not path.exists():
        np.save(path, np.random.default_rng(1).standard_normal(tts.speaker_size).astype(np.float32))
    return path


def test_icl_pieces_each_equal_their_own_synthesis(equal_bundle):
    """An ICL voice: every piece's prompt carries the reference, and still fits."""
    from kztts.core.audio import synthetic_voice
    from kztts.tts.tts import TTS

    tts = TTS(equal_bundle, context=48)  # the 17 reference frames and transcript take 31 positions
    icl = tts.voice_from_reference(synthetic_voice(), 24000, "A reference sentence.")
    text = ENGLISH.split("\n\n")[0]
    result = tts.synthesize(text, icl, greedy=True, max_frames=2)
    assert len(result.pieces) > 1 and _same_text([p.text for p in result.pieces], text)
    alone = [tts.synthesize(p.text, icl, greedy=True, max_frames=2) for p in result.pieces]
    np.testing.assert_array_equal(result.codes, np.concatenate([a.codes for a in alone]))
    np.testing.assert_array_equal(result.samples, join_pieces([a.samples for a in alone], tts.sample_rate))
