"""What every graph exporter needs to describe its output: the stamp a graph file carries, its
manifest entry as ONNX Runtime sees it, and the model facts the manifest records."""
from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from kztts.bundle.manifest import GraphSpec, TensorSpec
from kztts.bundle.sessions import _ORT_DTYPES, EXPORT_ID_KEY, GRAPH_KEY
from kztts.export.graphs.talker_graph import TalkerGraph


def stamp_graph(path: Path, name: str, export_id: str) -> None:
    """Record which bundle and graph a file belongs to, in the ONNX model metadata.

    The runtime compares the stamp with the manifest, so a graph copied in from
    another export (same I/O, other weights) is refused instead of run.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    meta.update({GRAPH_KEY: name, EXPORT_ID_KEY: export_id})
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(path))


def graph_spec(bundle_dir: Path, name: str, rel_file: str, variant: str, precision: str,
               export_id: str) -> GraphSpec:
    """Stamp an exported graph and describe its I/O as ONNX Runtime sees it."""
    path = bundle_dir / rel_file
    stamp_graph(path, name, export_id)
    so = ort.SessionOptions()  # only the I/O is read: no optimization, weights mapped (external data), not packed
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.disable_prepacking", "1")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def spec(args):
        return tuple(TensorSpec(a.name, _ORT_DTYPES.get(a.type, a.type),
                                tuple(d if isinstance(d, (int, str)) else "?" for d in a.shape)) for a in args)

    return GraphSpec(name, rel_file, variant, precision, spec(sess.get_inputs()), spec(sess.get_outputs()),
                     {"bytes": path.stat().st_size, "export_id": export_id})


def model_config(model) -> dict:
    """The shapes and ids the runtime needs, from a loaded Qwen3TTSForConditionalGeneration."""
    tc = model.config.talker_config
    cpc = tc.code_predictor_config
    talker = TalkerGraph(model.talker).shape
    cp_head_dim = getattr(cpc, "head_dim", cpc.hidden_size // cpc.num_attention_heads)
    return {
        "talker": {
            "num_layers": talker.num_layers, "hidden": talker.hidden, "num_heads": talker.num_heads,
            "num_kv_heads": talker.num_kv_heads, "head_dim": talker.head_dim,
            "rope_theta": talker.rope_theta, "vocab": talker.vocab,
            "max_positions": tc.max_position_embeddings, "text_hidden": tc.text_hidden_size,
            "text_vocab": tc.text_vocab_size, "num_code_groups": tc.num_code_groups,
            "rms_norm_eps": tc.rms_norm_eps,
        },
        "code_predictor": {
            "num_layers": cpc.num_hidden_layers, "hidden": cpc.hidden_size,
            "num_heads": cpc.num_attention_heads, "num_kv_heads": cpc.num_key_value_heads,
            "head_dim": cp_head_dim, "rope_theta": float(cpc.rope_theta), "vocab": cpc.vocab_size,
            "num_code_groups": cpc.num_code_groups,
            "has_projection": not isinstance(model.talker.code_predictor.small_to_mtp_projection,
                                             __import__("torch").nn.Identity),
        },
        "speaker_embedding_size": model.config.speaker_encoder_config.enc_dim,
        "sample_rate": 24000,
        "samples_per_frame": 1920,
    }


def special_ids(model) -> dict:
    c, tc = model.config, model.config.talker_config
    return {
        "im_start": c.im_start_token_id, "im_end": c.im_end_token_id, "assistant": c.assistant_token_id,
        "tts_pad": c.tts_pad_token_id, "tts_bos": c.tts_bos_token_id, "tts_eos": c.tts_eos_token_id,
        "codec_pad": tc.codec_pad_id, "codec_bos": tc.codec_bos_id, "codec_eos": tc.codec_eos_token_id,
        "codec_think": tc.codec_think_id, "codec_nothink": tc.codec_nothink_id,
        "codec_think_bos": tc.codec_think_bos_id, "codec_think_eos": tc.codec_think_eos_id,
    }
