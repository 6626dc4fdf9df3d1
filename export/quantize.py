"""w8a16 QDQ quantization of the static HTP graphs, calibrated on real prompts.

``onnxruntime.quantization``'s QNN configuration (``qnn_preprocess_model`` ->
``get_qnn_qdq_config`` -> ``quantize``): 8-bit weights, 16-bit activations (the
com.microsoft Q/DQ ops below opset 21), MinMax calibration.

Calibration data are the graphs' own inputs while the model speaks: real text
prompts (several languages, x-vector streaming and non-streaming, the speaker
vector from the model's speaker encoder on a voiced test signal) through the
float static graphs on the CPU EP, then greedy frames (CB0 from the Talker with a
repetition penalty, CB1..15 from the PyTorch Code Predictor) fed back as the
decode inputs, exactly as the runtime does. Each calibration pass drives a fresh
:class:`kztts.talker_static.StaticTalker` and yields its feeds one by one, so no
KV-cache snapshot is kept in memory.
"""
from __future__ import annotations

import contextlib
import logging
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

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


def _tables_spec(work_dir: Path) -> dict:
    """The manifest ``embeddings`` entry, rebuilt from the exported tables."""
    kinds = {np.dtype(np.uint16): "bf16", np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}
    spec = {}
    for f in sorted((work_dir / "embeddings").glob("*.npy")):
        a = np.load(f, mmap_mode="r")
        spec[f.stem] = {"file": f"embeddings/{f.name}", "dtype": kinds[a.dtype], "shape": list(a.shape)}
    return spec


class _Frames:
    """Greedy CB1..15 from the PyTorch Code Predictor (its own modules, fresh cache per frame)."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def codes(self, hidden: np.ndarray, c0: int) -> np.ndarray:
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


def recording_talker(work_dir: Path, float_files: dict[str, str], graph: str, config: dict, mask_value: float):
    """The float static graphs in ``work_dir`` on the CPU EP as a :class:`~kztts.talker_static.StaticTalker`
    (``config``: the manifest's Talker config), and the list it appends ``graph``'s feeds to (copied) on
    every call: the calibration data of a w8a16 quantization. The caller drains the list."""
    import onnxruntime as ort

    from kztts.talker_static import DECODE, PREFILL, StaticTalker

    if PREFILL not in float_files or DECODE not in float_files:
        raise RuntimeError("w8a16 calibration drives both static Talker graphs: place talker_prefill and "
                           "talker_decode on the HTP")

    def cpu(name):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        return ort.InferenceSession(str(work_dir / float_files[name]), sess_options=so,
                                    providers=["CPUExecutionProvider"])

    talker = StaticTalker(cpu(PREFILL), cpu(DECODE), config, mask_value)
    pending: list[dict] = []
    talker.on_feed = lambda name, feed: pending.append({k: np.array(v) for k, v in feed.items()}) \
        if name == graph else None
    return talker, pending


def calibration_feeds(model, work_dir: Path, float_files: dict[str, str], graph: str, *,
                      prompts=CALIBRATION_PROMPTS, frames: int = CALIBRATION_FRAMES,
                      mask_value: float = -50.0) -> Iterator[dict]:
    """Yield the feeds of ``graph`` ("talker_prefill" or "talker_decode") while the float static
    graphs speak the calibration prompts (see the module docstring)."""
    from kztts.embeddings import EmbeddingTables
    from kztts.export.graph_parts import model_config, special_ids
    from kztts.export.reference import synthetic_voice
    from kztts.prompt import build_prompt, language_id
    from kztts.replay import decode_input, greedy_cb0
    from kztts.text import TextTokenizer

    sid = special_ids(model)
    cfg = model_config(model)
    talker, pending = recording_talker(work_dir, float_files, graph, cfg["talker"], mask_value)
    tables = EmbeddingTables(work_dir, _tables_spec(work_dir), sid)
    tok = TextTokenizer(work_dir / "tokenizer.json")
    languages = {k.lower(): int(v) for k, v in (model.config.talker_config.codec_language_id or {}).items()}
    with torch.no_grad():
        speaker = model.extract_speaker_embedding(synthetic_voice(), 24000).float().numpy().reshape(-1)
    cp = _Frames(model)
    for text, lang, non_streaming in prompts:
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
        for k in range(min(frames, room)):
            # the reference's repetition penalty keeps greedy decoding from looping; EOS suppressed
            c0 = greedy_cb0(logits, sid["codec_eos"], history=history, repetition_penalty=REPETITION_PENALTY)
            history.append(c0)
            frame = np.concatenate([[c0], cp.codes(hidden, c0)])
            logits, hidden = talker.decode(decode_input(tables, prompt, frame, k))
            yield from pending
            pending.clear()


@contextlib.contextmanager
def _quiet_root_warnings():
    root = logging.getLogger()

    def drop(record: logging.LogRecord) -> bool:
        return record.name != "root" or record.levelno > logging.WARNING

    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


class _Reader:
    """``CalibrationDataReader`` over a feed generator."""

    def __init__(self, feeds: Iterator[dict]):
        self._it = iter(feeds)
        self.count = 0

    def get_next(self):
        nxt = next(self._it, None)
        if nxt is not None:
            self.count += 1
        return nxt

    def rewind(self):  # MinMax needs one pass
        pass


def quantize_graphs(work_dir: Path, float_files: dict[str, str], feeds: Callable[[str], Iterator[dict]], *,
                    per_channel: bool = False, keep_float: bool = False, what: str = "the calibration prompts"
                    ) -> dict[str, str]:
    """QDQ w8a16 versions of the float static graphs ``{graph name: rel file}``, each calibrated on
    ``feeds(name)`` (a fresh generator of that graph's input feeds per call): ``{graph name: rel file}``.

    The float graphs are removed afterwards unless ``keep_float``. ``what`` names the calibration
    data in the error raised when a graph got no feed."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kztts-quant-") as tmp:
        for name, rel in float_files.items():
            src = onnx.load(str(work_dir / rel))
            del src.metadata_props[:]  # qnn_preprocess_model (ORT 1.32) fails on metadata; graph_spec re-stamps
            pre, plain = Path(tmp) / f"{name}.pre.onnx", Path(tmp) / f"{name}.onnx"
            onnx.save(src, str(plain))
            model_in = pre if qnn_preprocess_model(src, str(pre)) else plain
            reader = _Reader(feeds(name))
            qcfg = get_qnn_qdq_config(str(model_in), reader, activation_type=QuantType.QUInt16,
                                      weight_type=QuantType.QUInt8, per_channel=per_channel)
            rel_q = rel.replace(".onnx", ".w8a16.onnx")
            with _quiet_root_warnings():  # "consider pre-processing" / "opset 21" notes: handled here
                quantize(str(model_in), str(work_dir / rel_q), qcfg)
            if reader.count == 0:
                raise RuntimeError(f"no calibration data for {name}: {what} do not fit the static context")
            log.info("%s: w8a16 calibrated on %d feeds", name, reader.count)
            out[name] = rel_q
    if not keep_float:
        for rel in float_files.values():
            (work_dir / rel).unlink()
    return out


def quantize_talker_graphs(model, work_dir: Path, float_files: dict[str, str], target, *,
                           prompts=CALIBRATION_PROMPTS, frames: int = CALIBRATION_FRAMES,
                           per_channel: bool = False, keep_float: bool = False) -> dict[str, str]:
    """QDQ w8a16 versions of the TTS Talker's float static graphs (``quantize_graphs``), calibrated
    while the float graphs speak ``prompts`` (``calibration_feeds``)."""
    return quantize_graphs(work_dir, float_files,
                           lambda name: calibration_feeds(model, work_dir, float_files, name, prompts=prompts,
                                                          frames=frames, mask_value=target.attention_mask_value),
                           per_channel=per_channel, keep_float=keep_float)
