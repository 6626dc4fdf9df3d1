"""The TTS calibration data of the QDQ HTP graphs (a ``kztts.export.htp.calibration.CalibrationSource``): the
graphs' own inputs while the model speaks.

Real text prompts (:data:`CALIBRATION_PROMPTS`: several languages, x-vector streaming and non-streaming, the
speaker vector from the model's speaker encoder on a voiced test signal; a CustomVoice checkpoint's first preset
speaker, none for VoiceDesign) run through the float graphs on the CPU
EP, then greedy frames (CB0 from the Talker with a repetition penalty, CB1..15 from the PyTorch Code Predictor) are
fed back as the decode inputs, exactly as the runtime does. The Talker runner is
``kztts.export.htp.calibration.recording_talker``'s: the whole-stack static graphs, or the layer graphs for their
quantized variants. ``cp_frame`` is calibrated on its inputs at each frame (the Talker's hidden state, CB0's
embedding, the default sampling settings, seeded uniforms); only its stack and heads are quantized, its in-graph
sampling stays float (``kztts.export.htp.static_graphs.export_cp_frame_htp``). ``decoder_chunk`` is calibrated on
the frames each prompt was spoken in, decoded by its float graph from a reset as the runtime decodes them
(``kztts.export.htp.calibration.chunk_decoder_feeds``; ``kztts.export.htp.static_graphs.export_decoder_chunk``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator

import numpy as np
import torch

from kztts.bundle.embeddings import EmbeddingTables
from kztts.bundle.manifest import MANIFEST_NAME, read_manifest
from kztts.eval.replay import decode_input, greedy_cb0
from kztts.export.common.reference import synthetic_voice
from kztts.export.graphs.codec_graphs import _decoder_of
from kztts.export.htp.calibration import CP_FRAME, DECODER_CHUNK, chunk_decoder_feeds, recording_talker
from kztts.export.tts.tts_parts import model_config, special_ids
from kztts.htp.targets import Target
from kztts.tts.prompt import build_prompt, language_id
from kztts.tts.text.tokenizer import TextTokenizer

log = logging.getLogger(__name__)

CALIBRATION_PROMPTS = (  # (text, language, non_streaming)
    ("Hello world, this is a tiny test.", "english", True),
    ("The weather is lovely today; shall we take a walk along the river before dinner?", "english", False),
    ("Bonjour je m'appelle Kazeia, et je lis ce texte à voix haute.", "french", True),
    ("Guten Morgen! Wie geht es Ihnen heute?", "german", False),
    ("今天天气很好，我们去公园散步吧。", "chinese", True),
    ("Numbers like 1, 2, 3 and 2048 should be read clearly.", "auto", True),
)
CALIBRATION_FRAMES = 24
REPETITION_PENALTY = 1.05  # the released checkpoints' Talker setting
# The Code Predictor's sampling settings while calibrating cp_frame: the released checkpoints' defaults.
CP_CALIBRATION_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}


def _tables_spec(work_dir: Path) -> dict:
    """The manifest ``embeddings`` entry: the bundle's own when it has a manifest (HTP graphs added to an exported
    bundle, whose Code Predictor codec table is a view into its weights file), else rebuilt from the tables the
    export has written so far."""
    if (work_dir / MANIFEST_NAME).is_file():
        return read_manifest(work_dir).embeddings
    kinds = {np.dtype(np.uint16): "bf16", np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}
    spec = {}
    for f in sorted((work_dir / "embeddings").glob("*.npy")):
        a = np.load(f, mmap_mode="r")
        spec[f.stem] = {"file": f"embeddings/{f.name}", "dtype": kinds[a.dtype], "shape": list(a.shape)}
    return spec


class _Frames:
    """Greedy CB1..15 from the PyTorch Code Predictor (its own modules, fresh cache per frame). ``memo`` keeps each
    frame's codes by its exact inputs: every calibrated graph speaks the same prompts, and the PyTorch Code Predictor
    is most of the time a pass takes, so later graphs reuse what the first computed."""

    def __init__(self, model, memo: dict[tuple[bytes, int], np.ndarray]):
        self.model = model
        self.memo = memo

    def codes(self, hidden: np.ndarray, c0: int) -> np.ndarray:
        key = (np.ascontiguousarray(hidden, np.float32).tobytes(), int(c0))
        if key not in self.memo:
            self.memo[key] = self._codes(hidden, c0)
        return self.memo[key]

    @torch.no_grad()
    def _codes(self, hidden: np.ndarray, c0: int) -> np.ndarray:
        from transformers.cache_utils import DynamicCache

        tk = self.model.talker
        cp = tk.code_predictor
        h = torch.from_numpy(np.asarray(hidden, np.float32)).view(1, 1, -1)
        e0 = tk.get_input_embeddings()(torch.tensor([[c0]]))
        cache = DynamicCache()
        o = cp.model(inputs_embeds=cp.small_to_mtp_projection(torch.cat([h, e0], dim=1)), past_key_values=cache,
                     use_cache=True)
        groups = len(cp.lm_head)
        out = []
        for g in range(groups):
            c = int(torch.argmax(cp.lm_head[g](o.last_hidden_state[:, -1])[0]))
            out.append(c)
            if g + 1 < groups:
                emb = cp.model.codec_embedding[g](torch.tensor([[c]]))
                o = cp.model(inputs_embeds=cp.small_to_mtp_projection(emb), past_key_values=cache, use_cache=True)
        return np.asarray(out, np.int64)


def _calibration_speaker(model, tables: EmbeddingTables) -> np.ndarray | None:
    """The speaker vector the calibration prompts are spoken with: an x-vector (Base), a preset speaker's codec row
    (CustomVoice), or none (VoiceDesign)."""
    if model.speaker_encoder is not None:
        with torch.no_grad():
            return model.extract_speaker_embedding(synthetic_voice(), 24000).float().numpy().reshape(-1)
    presets = model.config.talker_config.spk_id or {}
    if presets:
        return np.asarray(tables.codec([int(presets[sorted(presets)[0]])])[0], np.float32)
    return None


def _cp_feed(hidden: np.ndarray, c0_embed: np.ndarray, rng: np.random.Generator, groups: int) -> dict:
    s = CP_CALIBRATION_SAMPLING
    return {"hidden": np.asarray(hidden, np.float32).reshape(1, -1), "c0_embed": c0_embed.reshape(1, -1),
            "temperature": np.array([s["temperature"]], np.float32), "top_k": np.array([s["top_k"]], np.int64),
            "top_p": np.array([s["top_p"]], np.float32),
            "repetition_penalty": np.array([s["repetition_penalty"]], np.float32),
            "uniforms": rng.random(groups, dtype=np.float32)}


@dataclass(frozen=True, eq=False)
class TtsPrompts:
    """The calibration prompts spoken by ``model`` (the loaded Qwen3TTSForConditionalGeneration), up to
    ``frames`` greedy frames each (module docstring)."""

    model: Any
    prompts: tuple[tuple[str, str, bool], ...] = CALIBRATION_PROMPTS  # (text, language, non_streaming)
    frames: int = CALIBRATION_FRAMES
    memo: dict = field(default_factory=dict, repr=False)  # _Frames' codes, shared by the graphs' passes
    what: ClassVar[str] = "the calibration prompts"
    reads_torch_model: ClassVar[bool] = True  # the speaker encoder and the Code Predictor's frames

    def feeds(self, work_dir: Path, drive: dict[str, str], graph: str, target: Target) -> Iterator[dict]:
        """Yield the feeds of ``graph`` (a whole-stack Talker graph, a layer graph, ``cp_frame`` or
        ``decoder_chunk``) while the float graphs ``drive`` speak the prompts."""
        model = self.model
        sid = special_ids(model)
        cfg = model_config(model)
        talker, pending = recording_talker(work_dir, drive, graph, cfg["talker"], target)
        tables = EmbeddingTables(work_dir, _tables_spec(work_dir), sid)
        tok = TextTokenizer(work_dir / "tokenizer.json")
        languages = {k.lower(): int(v) for k, v in (model.config.talker_config.codec_language_id or {}).items()}
        speaker = _calibration_speaker(model, tables)
        cp = _Frames(model, self.memo)
        rng = np.random.default_rng(0)
        for text, lang, non_streaming in self.prompts:
            lid = None if lang == "auto" else language_id(languages, lang)
            prompt = build_prompt(tables, tok.assistant_ids(text), special_ids=sid, language_id=lid, speaker=speaker,
                                  mode="xvector", non_streaming=non_streaming)
            room = talker.context - prompt.embeds.shape[0] - 1
            if room < 1:
                log.warning("calibration prompt %r does not fit the static context; skipped", text[:30])
                continue
            logits, hidden = talker.prefill(prompt.embeds)
            yield from pending
            pending.clear()
            history: list[int] = []
            frames = []
            for k in range(min(self.frames, room)):
                # the reference's repetition penalty keeps greedy decoding from looping; EOS suppressed
                c0 = greedy_cb0(logits, sid["codec_eos"], history=history, repetition_penalty=REPETITION_PENALTY)
                history.append(c0)
                if graph == CP_FRAME:
                    c0_embed = np.asarray(tables.codec([c0]), np.float32)
                    yield _cp_feed(hidden, c0_embed, rng, tables.num_cp_groups)
                frame = np.concatenate([[c0], cp.codes(hidden, c0)])
                frames.append(frame)
                logits, hidden = talker.decode(decode_input(tables, prompt, frame, k))
                yield from pending
                pending.clear()
            if graph == DECODER_CHUNK and frames:
                yield from chunk_decoder_feeds(work_dir / drive[DECODER_CHUNK], np.stack(frames),
                                               int(_decoder_of(model).decoder.config.codebook_size))
