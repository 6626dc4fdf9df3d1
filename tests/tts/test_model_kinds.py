"""CustomVoice (1.7B and 0.6B layouts) and VoiceDesign bundles against qwen-tts's own ``generate_custom_voice`` /
``generate_voice_design``: the prompt and 40 greedy frames, solo and in a batch mixing speakers, dialects,
instructions and both text modes; what each kind refuses (``kztts.tts.model_kind``)."""
from __future__ import annotations

import numpy as np
import pytest

from kztts import TTS, SynthesisRequest
from kztts.core.errors import KzttsError
from kztts.tts.model_kind import ModelKind
from kztts.tts.prompt import prompt_length

FRAMES = 40
EN = "Hello world, this is a tiny test."
ZH = "你好，世界。这是一个测试。"
# per kind: requests covering an English speaker, a dialect speaker in Chinese and in auto, with and without an
# instruction (the 0.6B's instruction is one qwen-tts drops)
REQUESTS = {
    "custom_voice": [dict(text=EN, language="English", speaker="Ryan"),
                     dict(text=ZH, language="Chinese", speaker="eric", instruct="用特别愤怒的语气说"),
                     dict(text=ZH, language="Auto", speaker="dylan"),
                     dict(text=EN, language="English", speaker="aiden", instruct="Very happy.")],
    "custom_voice_06": [dict(text=EN, language="English", speaker="ryan", instruct="Very happy."),
                        dict(text=ZH, language="Auto", speaker="eric"),
                        dict(text=ZH, language="Chinese", speaker="Dylan")],
    "voice_design": [dict(text=EN, language="English", instruct="A deep, calm male voice."),
                     dict(text=ZH, language="Auto", instruct=""),
                     dict(text=ZH, language="Chinese", instruct="体现撒娇稚嫩的萝莉女声，音调偏高。")],
}
MODES = {"nonstream": True, "stream": False}  # qwen-tts's non_streaming_mode


@pytest.fixture(scope="module")
def references(kind_dirs):
    """{(kind, mode): [PresetRun]}: one qwen-tts call per kind and mode over all its requests (a batch)."""
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.common.reference import preset_run

    class Runs(dict):
        def __missing__(self, key):
            name, mode = key
            self[key] = preset_run(load_reference(kind_dirs[name]), REQUESTS[name], frames=FRAMES,
                                   non_streaming=MODES[mode])
            return self[key]

    return Runs()


@pytest.fixture(scope="module")
def bundles(custom_voice_bundle, custom_voice_06_bundle, voice_design_bundle):
    return {"custom_voice": TTS(custom_voice_bundle), "custom_voice_06": TTS(custom_voice_06_bundle),
            "voice_design": TTS(voice_design_bundle)}


def kz_request(name: str, r: dict, mode: str) -> SynthesisRequest:
    instruct = None if name == "custom_voice_06" else r.get("instruct")  # dropped by qwen-tts: refused by kztts
    return SynthesisRequest(r["text"], speaker=r.get("speaker"), instruct=instruct, language=r["language"],
                            greedy=True, max_frames=FRAMES, streaming_text=mode == "stream")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", REQUESTS)
def test_prompt_and_greedy_codes_equal_qwen_tts(bundles, references, name, mode):
    tts = bundles[name]
    for r, ref in zip(REQUESTS[name], references[name, mode]):
        request = kz_request(name, r, mode)
        prompt = tts.prompt(request)
        assert prompt.embeds.shape == ref.prefill.shape, r
        np.testing.assert_allclose(prompt.embeds, ref.prefill, atol=1e-5, rtol=0)  # measured 1.2e-7
        np.testing.assert_allclose(prompt.trailing, ref.trailing[:len(prompt.trailing)], atol=1e-5, rtol=0)
        assert ref.codes.shape == (FRAMES, 16)  # a random model never stops by itself
        np.testing.assert_array_equal(tts.generate_codes(request), ref.codes, err_msg=str(r))


@pytest.mark.parametrize("name", REQUESTS)
def test_a_mixed_batch_equals_qwen_tts(bundles, references, name):
    """Every request of a kind in both text modes, through one batch loop: each row's codes are qwen-tts's."""
    tts = bundles[name]
    requests = [kz_request(name, r, mode) for mode in MODES for r in REQUESTS[name]]
    results = tts.synthesize_many(requests, batch=4)
    want = [ref.codes for mode in MODES for ref in references[name, mode]]
    for request, result, codes in zip(requests, results, want):
        np.testing.assert_array_equal(result.codes, codes, err_msg=str(request))


def test_prompt_length_counts_the_instruction(bundles):
    """The long-text splitter's prompt length (``prompt_length``) agrees with the built prompt, instruction,
    dialect tag and all, so a long text's every piece fits with its instruction."""
    tts = bundles["custom_voice"]
    for instruct, language, speaker in [("Very happy.", "english", "ryan"), (None, "auto", "eric"),
                                        ("Slowly.", "auto", "serena")]:
        for streaming in (False, True):
            r = SynthesisRequest(EN, speaker=speaker, instruct=instruct, language=language, streaming_text=streaming)
            prepared = tts.prepare(r)
            n = prompt_length(len(tts.tokenizer.text_body(tts.tokenizer.assistant_ids(EN))),
                              language=prepared.language_id is not None, speaker=True, mode="xvector",
                              non_streaming=not streaming,
                              instruct_tokens=len(tts.tokenizer.instruct_ids(instruct)) if instruct else 0)
            assert n == prepared.prompt().embeds.shape[0] == tts.prompt(r).embeds.shape[0]


def test_long_text_pieces_carry_speaker_and_instruction(bundles):
    tts = TTS(bundles["custom_voice"].bundle, context=48)
    text = " ".join([EN] * 6)
    request = SynthesisRequest(text, speaker="ryan", instruct="Very happy.", language="english", greedy=True,
                               max_frames=6)
    pieces = tts.pieces(request)
    assert len(pieces) > 1
    result = tts.synthesize(request)
    first = tts.generate_codes(SynthesisRequest(pieces[0], speaker="ryan", instruct="Very happy.",
                                                language="english", greedy=True, max_frames=6))
    np.testing.assert_array_equal(result.codes[:len(first)], first)


def test_manifest_lists_speakers_and_instruction(bundles):
    cv, cv06, vd = (ModelKind.of(bundles[n].bundle.manifest) for n in REQUESTS)
    assert (cv.kind, cv.takes_instruction, cv.size) == ("custom_voice", True, "1b7")
    assert (cv06.kind, cv06.takes_instruction, cv06.size) == ("custom_voice", False, "0b6")
    assert (vd.kind, vd.takes_instruction, vd.speakers) == ("voice_design", True, {})
    assert len(cv.speakers) == 9 and cv.speakers["eric"].dialect == "sichuan_dialect"
    assert cv.speakers["dylan"].dialect == "beijing_dialect" and cv.speakers["ryan"].dialect is None
    assert cv.speakers["ryan"].id == 3061
    assert "graphs/speaker_encoder.onnx" not in {g.file for g in bundles["custom_voice"].bundle.manifest.graphs.values()}


def test_voice_from_speaker_equals_the_speaker_name(bundles):
    tts = bundles["custom_voice"]
    by_name = tts.generate_codes(EN, speaker="Eric", language="auto", greedy=True, max_frames=5)
    by_voice = tts.generate_codes(EN, tts.voice_from_speaker("ERIC"), language="auto", greedy=True, max_frames=5)
    np.testing.assert_array_equal(by_name, by_voice)


@pytest.mark.parametrize("name, request_kw, message", [
    ("custom_voice", dict(speaker="bob"), "unknown speaker 'bob'; this bundle's speakers are aiden, dylan, eric"),
    ("custom_voice_06", dict(speaker="ryan", instruct="Very happy."),
     "this CustomVoice 0.6B bundle takes no instruction (qwen-tts drops the instruction of the 0.6B"),
    ("voice_design", dict(speaker="ryan"), "speaker 'ryan': this VoiceDesign 1.7B bundle has no preset speakers; it makes "
                                           "the voice from the instruction"),
    ("custom_voice", dict(speaker="ryan", voice="xvector"), "give a speaker name or a voice, not both"),
    ("custom_voice", dict(voice="xvector"), "a reference voice cannot be used with this CustomVoice 1.7B bundle: name one of its preset speakers"),
    ("voice_design", dict(voice="xvector"), "a reference voice cannot be used with this VoiceDesign 1.7B bundle"),
])
def test_refusals(bundles, name, request_kw, message):
    tts = bundles[name]
    if request_kw.get("voice") == "xvector":
        from kztts import Voice

        request_kw["voice"] = Voice(np.zeros(tts.tables.hidden, np.float32))
    with pytest.raises(KzttsError) as err:
        tts.synthesize(EN, **request_kw, max_frames=3)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_voice_design_without_instruction_is_allowed(bundles):
    """qwen-tts treats an empty instruction as none; so does kztts (the prompt has no instruction positions)."""
    tts = bundles["voice_design"]
    assert tts.prompt(EN, instruct="").embeds.shape == tts.prompt(EN).embeds.shape
    assert tts.generate_codes(EN, greedy=True, max_frames=3).shape == (3, 16)
