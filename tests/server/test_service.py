"""kztts.server.service: what a server serves. ``ServeOptions.check`` refuses bad flags before anything loads;
``Service.open`` opens a TTS bundle (voices, the environment's sampling settings, its engine) or an LM bundle (no
voices), names the model, and its scheduler makes it ready until it drains or closes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kztts.core.errors import KzttsError
from kztts.server.bodies import Limits
from kztts.server.chat import BatchedChat
from kztts.server.service import ServeOptions, Service
from kztts.server.speech import BatchedSpeech


@pytest.mark.parametrize("options, words", [
    (dict(batch=0), "--batch must be an integer >= 1, got 0"),
    (dict(batch=True), "--batch must be an integer >= 1, got True"),
    (dict(queue=-1), "--queue must be an integer >= 0, got -1"),
    (dict(port=70000), "--port must be 0..65535"),
    (dict(api_key="  "), "the API key is empty"),
    (dict(limits=Limits(max_frames=0)), "limit max_frames must be >= 1, got 0"),
    (dict(limits=Limits(max_body_bytes=0)), "limit max_body_bytes must be >= 1"),
    (dict(context=8), "--context must be an integer >= 16, got 8"),
    (dict(voices=Path("/nonexistent/voices")), "--voices must be a folder"),
])
def test_bad_options_are_refused_before_anything_loads(tmp_path, options, words):
    with pytest.raises(KzttsError, match=words):
        ServeOptions(bundle=tmp_path, **options).check()


def test_good_options_pass_as_they_are(tmp_path):
    options = ServeOptions(bundle=tmp_path, port=0, queue=0, api_key="k", context=16, voices=tmp_path)
    assert options.check() is options and options.limits == Limits()


def test_an_lm_bundle_is_a_chat_service(chat_bundle, tmp_path):
    with pytest.raises(KzttsError, match="is an LM bundle: it speaks no voices"):
        Service.open(ServeOptions(bundle=chat_bundle, voices=tmp_path))
    service = Service.open(ServeOptions(bundle=chat_bundle, batch=2))
    assert service.kind == "lm" and service.model_id == Path(chat_bundle).name and service.voices is None
    assert isinstance(service.engine, BatchedChat) and service.engine.capacity == 2
    assert not service.ready  # no scheduler thread yet
    service.start()
    try:
        assert service.ready
        service.scheduler.drain()
        assert not service.ready  # draining: no new requests
    finally:
        service.close()
    assert not service.scheduler.alive


def test_a_tts_bundle_is_a_speech_service_with_its_voices_and_settings(equal_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("KZTTS_TEMP", "0.5")
    monkeypatch.setenv("KZTTS_CP_TOPK", "7")
    np.save(tmp_path / "bob.npy", np.ones(64, np.float32))
    service = Service.open(ServeOptions(bundle=equal_bundle, voices=tmp_path, model_name="my-voice", context=64,
                                        batch=3, queue=5))
    service.start()
    try:
        assert service.kind == "tts" and service.model_id == "my-voice" and service.model.talker.context == 64
        assert isinstance(service.engine, BatchedSpeech) and service.engine.capacity == 3
        assert service.scheduler.queue_limit == 5 and service.limits == Limits()
        assert [v["id"] for v in service.voices.listing()] == ["bob", "default"]
        # the reference preset of the bundle's generation config, with the environment's overrides
        assert service.settings.talker.temperature == 0.5 and service.settings.code_predictor.top_k == 7
    finally:
        service.close()


def test_an_lm_with_a_tts_is_a_spoken_chat_service_over_both_batch_loops(chat_bundle, equal_bundle):
    from kztts.server.spoken_chat import SpokenChatEngine

    service = Service.open(ServeOptions(bundle=chat_bundle, tts=equal_bundle, batch=3))
    service.start()
    try:
        engine = service.engine
        assert isinstance(engine, SpokenChatEngine) and service.tts is not None and service.voices is not None
        assert isinstance(engine.chat, BatchedChat) and isinstance(engine.speech, BatchedSpeech)
        assert engine.capacity == engine.chat.capacity == engine.speech.capacity == 3
        assert "up to 3 conversations share each token" in engine.mode and "up to 3 requests" in engine.mode
    finally:
        service.close()
