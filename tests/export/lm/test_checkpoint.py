"""kztts.export.lm.checkpoint / lm_magnitudes on tiny random Qwen2 and Qwen3 causal LMs, saved as
Hugging Face directories and as GGUF files (written with the gguf package), and on the real
Qwen2.5-Coder-1.5B GGUF (slow)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from support import empty_gguf, real_gguf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kztts.core.errors import KzttsError  # noqa: E402
from kztts.export.lm.checkpoint import CHECK_STRINGS, check_causal_lm, load_causal_lm  # noqa: E402
from kztts.export.lm.magnitudes import LAYER_HOOK_STATS, hook_magnitudes  # noqa: E402

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>"]  # the last: beyond transformers' 3
USER_DEFINED = "<tool_call>"  # an added token that is not special, as in Qwen2.5
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = list(CHECK_STRINGS) * 10 + ["print('hello world')", "Bonjour, ça va très bien.", "你好，世界"]
HEAD_DIM = {"qwen2": 8, "qwen3": 16}  # Qwen3's differs from hidden / heads, as in the real models


def _tiny_tokenizer(folder: Path):
    """A byte-level BPE trained on a few lines, as a Qwen2 fast tokenizer (Qwen's pre-tokenizer regex)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir(parents=True)
    bpe.model.save(str(folder))
    tok = Qwen2TokenizerFast(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"),
                             unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.add_tokens([USER_DEFINED])
    tok.chat_template = TEMPLATE
    return tok


def _tiny_model(folder: Path, model_type: str, tok):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0 if model_type == "qwen2" else 1)
    kw = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=HEAD_DIM[model_type], max_position_embeddings=128,
              rope_theta=10000.0, tie_word_embeddings=model_type == "qwen3",
              eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    config, cls = (Qwen2Config(**kw), Qwen2ForCausalLM) if model_type == "qwen2" else (Qwen3Config(**kw),
                                                                                         Qwen3ForCausalLM)
    model = cls(config).eval()
    with torch.no_grad():  # norms away from 1 and biases away from 0: a wrong mapping shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(torch.rand_like(p) + 0.5 if name.endswith("norm.weight") else torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def _write_gguf(model, tok, path: Path) -> int:
    """The model as an F32 GGUF with llama.cpp's names and tokenizer metadata; returns its tensor count."""
    import gguf

    c = model.config
    arch = c.model_type
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(c.max_position_embeddings)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_embedding_length(c.hidden_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(HEAD_DIM[arch])
    w.add_value_length(HEAD_DIM[arch])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_theta)
    backend = tok.backend_tokenizer
    vocab = backend.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(backend.to_str())["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 4 if t == USER_DEFINED else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(c.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2 if arch == "qwen2" else gguf.MODEL_ARCH.QWEN3,
                                     c.num_hidden_layers)
    state = {k: v for k, v in model.state_dict().items() if not (c.tie_word_embeddings and k == "lm_head.weight")}
    for name, p in state.items():
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), p.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return len(state)


@pytest.fixture(scope="module")
def tiny_lms(tmp_path_factory):
    """{model_type: (HF directory, GGUF file, GGUF tensor count, the transformers model)}."""
    pytest.importorskip("gguf")
    root = tmp_path_factory.mktemp("tiny_lms")
    tok = _tiny_tokenizer(root / "bpe")
    out = {}
    for model_type in ("qwen2", "qwen3"):
        model = _tiny_model(root / model_type, model_type, tok)
        gguf_path = root / "gguf" / f"{model_type}.gguf"
        gguf_path.parent.mkdir(exist_ok=True)
        out[model_type] = (root / model_type, gguf_path, _write_gguf(model, tok, gguf_path), model)
    return out


IDS = [[1, 50, 7, 200, 3, 99, 12], [5, 6]]


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@pytest.mark.parametrize("form", ["dir", "gguf"])
def test_loads_model_tokenizer_template_and_facts(tiny_lms, tmp_path, model_type, form):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    folder, gguf_path, n_tensors, reference = tiny_lms[model_type]
    lm = load_causal_lm(folder if form == "dir" else gguf_path, tmp_path / "tok")
    f = lm.facts
    assert (f.model_type, f.hidden, f.layers, f.heads, f.kv_heads, f.head_dim, f.ffn) == (
        model_type, 32, 3, 4, 2, HEAD_DIM[model_type], 64)
    assert (f.qkv_bias, f.qk_norm) == (model_type == "qwen2", model_type == "qwen3")
    assert f.tie_word_embeddings == (model_type == "qwen3")
    assert f.vocab == reference.config.vocab_size and f.rope_theta == 10000.0
    im_end = reference.config.eos_token_id
    assert f.im_end_id == im_end and im_end in f.eos_ids
    assert lm.gguf_tensors == (n_tensors if form == "gguf" else None)
    assert lm.chat_template == TEMPLATE
    chat = [{"role": "user", "content": "Salut"}]
    assert lm.hf_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nSalut<|im_end|>\n<|im_start|>assistant\n")
    assert not lm.model.training and next(lm.model.parameters()).dtype == torch.float32
    for ids in IDS:  # the GGUF holds F32 tensors: the same numbers, bit for bit
        assert torch.equal(_logits(lm.model, ids), _logits(reference, ids))
    # the saved tokenizer.json encodes like the checkpoint directory's own tokenizer
    assert lm.tokenizer_json == tmp_path / "tok" / "tokenizer.json"
    saved, own = Tokenizer.from_file(str(lm.tokenizer_json)), AutoTokenizer.from_pretrained(str(folder))
    for text in CHECK_STRINGS + ("x = [i ** 2 for i in range(10)]  # carrés", "快速排序是一种分治算法。",
                                 "<|fim_prefix|>def f():<tool_call>{}</tool_call><|endoftext|>"):
        assert saved.encode(text, add_special_tokens=False).ids == own.encode(text, add_special_tokens=False)
    assert saved.token_to_id("<|im_end|>") == im_end


def test_refusals_are_one_line(tiny_lms, tmp_path, monkeypatch):
    def refused(path, pattern):
        with pytest.raises(KzttsError, match=pattern) as exc:
            check_causal_lm(path)
        assert "\n" not in str(exc.value)

    refused(tmp_path / "nothing", r"no such file or directory; give a Qwen2/Qwen3")
    refused(tmp_path, r"config\.json: missing; .* is not a Hugging Face checkpoint")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    refused(tmp_path, r"model_type is 'llama', not qwen2/qwen3")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2Model"]}))
    refused(tmp_path, r"do not include Qwen2ForCausalLM; kztts loads causal LMs only")
    (tmp_path / "config.json").write_text("{not json")
    refused(tmp_path, r"not valid JSON")
    (tmp_path / "weights.bin").write_bytes(b"PK\x03\x04 not a gguf")
    refused(tmp_path / "weights.bin", r"not a GGUF file")
    llama = empty_gguf(tmp_path / "llama.gguf", "llama")
    refused(llama, r"a GGUF of architecture 'llama', not qwen2/qwen3")
    (tmp_path / "torn.gguf").write_bytes(tiny_lms["qwen2"][1].read_bytes()[:200])
    refused(tmp_path / "torn.gguf", r"torn\.gguf: the GGUF header ends early")
    gguf_path = tiny_lms["qwen2"][1]
    assert check_causal_lm(gguf_path) == "qwen2"
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (weightless / name).write_bytes((tiny_lms["qwen2"][0] / name).read_bytes())
    with pytest.raises(KzttsError, match=r"weightless: transformers cannot load this qwen2 checkpoint \(OSError"):
        load_causal_lm(weightless, tmp_path / "tok")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    refused(gguf_path, r"needs the gguf package: pip install gguf")


def test_hook_magnitudes_match_the_hidden_states(tiny_lms):
    """The residual after each layer equals transformers' own hidden states; the next layer's input
    is the previous layer's output; each stat is the maximum over the prompts."""
    model = tiny_lms["qwen3"][3]
    mags = hook_magnitudes(model, IDS)
    assert len(mags["layers"]) == 3 and set(mags["layers"][0]) == set(LAYER_HOOK_STATS)
    for p, ids in zip(mags["prompts"], IDS):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        hidden = out.hidden_states
        assert p["tokens"] == len(ids)
        for i in range(3):
            assert p["layers"][i]["residual_in"] == pytest.approx(float(hidden[i].abs().max()), rel=1e-6)
        for i in range(2):  # the last entry of hidden_states is after the final norm
            assert p["layers"][i]["residual_out"] == p["layers"][i + 1]["residual_in"]
        assert p["head"]["residual_in"] == p["layers"][2]["residual_out"]
        assert p["head"]["logits"] == pytest.approx(float(out.logits.abs().max()), rel=1e-6)
    for i, row in enumerate(mags["layers"]):
        for stat, value in row.items():
            assert value == max(p["layers"][i][stat] for p in mags["prompts"])
    with pytest.raises(ValueError):
        hook_magnitudes(model, [[]])


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_hook_magnitudes_measure_what_the_layer_graphs_probe(tiny_lms, kind):
    """Each hooked stat is the layer graph's probe of the same name (``kztts calibrate``'s ``stats``) over
    the same positions: every layer of the tiny model, fed transformers' own hidden states as one chunk,
    gives through the layer graph's module the magnitudes the hooks record (attention scores aside: not
    hooked)."""
    from kztts.bundle.segments import LAYER_STATS
    from kztts.export.common.qwen3_stack import rope_cos_sin
    from kztts.export.graphs.segment_graphs import LayerStaticGraph
    from kztts.export.graphs.talker_graph import talker_shape

    model = tiny_lms[kind][3]
    s = talker_shape(model)
    mags = hook_magnitudes(model, IDS)
    for p, ids in zip(mags["prompts"], IDS):
        S = len(ids)
        C = S + 1  # one cache slot, masked
        mask = torch.full((1, 1, S, C), -50.0)
        mask[0, 0, :, 1:] = torch.where(torch.ones(S, S, dtype=torch.bool).tril(), 0.0, -50.0)
        cos, sin = rope_cos_sin(torch.arange(S), s.head_dim, s.rope_theta)
        past_k, past_v = torch.zeros(s.num_kv_heads, 1, s.head_dim, 1), torch.zeros(s.num_kv_heads, 1, 1, s.head_dim)
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            for i, layer in enumerate(model.model.layers):
                graph = LayerStaticGraph(layer, s, S, C).eval()
                stats = graph(hidden[i], mask, cos, sin, past_k, past_v)[3]
                for stat in LAYER_HOOK_STATS:
                    assert float(stats[LAYER_STATS.index(stat)]) == pytest.approx(p["layers"][i][stat], rel=1e-5), \
                        (i, stat)


REAL_PROMPTS = ("Write a Python function that checks whether a number is prime.",
                "Explique en une phrase ce qu'est une liste chaînée.",
                "Explain in one sentence what a hash table is.", "请用一句话解释什么是递归。")


@pytest.mark.slow
def test_real_qwen25_coder_checkpoint(tmp_path):
    """The fetched 1.5B GGUF: the structure the issue states, and its massive residual (~4.2e3 in
    layers 2-25, cancelled by layer 26's MLP) measured through hooks. About 6 GB of RAM."""
    from tokenizers import Tokenizer

    lm = load_causal_lm(real_gguf(), tmp_path)
    f = lm.facts
    assert lm.gguf_tensors == 339
    assert (f.model_type, f.hidden, f.layers, f.heads, f.kv_heads, f.head_dim, f.ffn, f.vocab) == (
        "qwen2", 1536, 28, 12, 2, 128, 8960, 151936)
    assert f.qkv_bias and not f.qk_norm and f.im_end_id == 151645
    assert "<|im_start|>" in lm.chat_template
    tok = Tokenizer.from_file(str(lm.tokenizer_json))
    chats = [lm.hf_tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                 add_generation_prompt=True) for t in REAL_PROMPTS]
    mags = hook_magnitudes(lm.model, [tok.encode(c, add_special_tokens=False).ids for c in chats])
    residual = [row["residual_out"] for row in mags["layers"]]
    assert all(3.5e3 < r < 5e3 for r in residual[2:26]), residual
    assert residual[0] < 1e3 and residual[26] < 1e3, residual  # before layers 1-2 write it, after 26 cancels it
    assert mags["layers"][26]["mlp_out"] > 3.5e3  # measured 4787 (residual 4113..4409 in layers 2-25)


BUNDLE_ENV = "KZTTS_QWEN25_SEGMENTS_BUNDLE"


def _worst(table: list[dict], head: dict, mags: dict) -> tuple[float, tuple, dict]:
    """Largest relative difference of the layer graphs' probes (``table``: per layer {stat: value}) to the
    hooks' magnitudes, where it is, and the largest per stat."""
    per_stat: dict = {}
    worst = (0.0, ())
    rows = [(i, g, h) for i, (g, h) in enumerate(zip(table, mags["layers"]))] + [("head", head, mags["head"])]
    for unit, graph, hooks in rows:
        for stat, ref in hooks.items():
            rel = abs(graph[stat] - ref) / ref
            per_stat[stat] = max(per_stat.get(stat, 0.0), rel)
            if rel > worst[0]:
                worst = (rel, (unit, stat, graph[stat], ref))
    return worst[0], worst[1], per_stat


@pytest.mark.slow
def test_calibrate_agrees_with_hooks_on_the_real_checkpoint(tmp_path):
    """The layer graphs' magnitude probes (what ``kztts calibrate`` records, fp32 on the CPU) against
    transformers forward hooks (``hook_magnitudes``) on the 1.5B GGUF, the same chat prompts, every position:
    every layer's residual / norm / q-k-v / attention / MLP magnitudes and the head's agree within 1%.

    The probes are compared on the prompts run one position at a time (the decode graphs, seq 1): a prefill
    chunk's probes also see its padded rows (zero embeddings past the prompt's end, computed like tokens), so
    they can exceed what the prompt's own positions reach (measured: attn_out of layer 22 8.5 against 4.2
    through hooks; printed). The prefill graphs are checked on the prompt's own rows of their outputs: each
    layer's hidden_out (residual_out) and the head's logits, within 1% of the hooks.

    Needs the fetched GGUF (``kztts fetch-lm``) and its LM bundle with layer graphs, named by
    $KZTTS_QWEN25_SEGMENTS_BUNDLE:
    ``kztts export --gguf GGUF --target benchmarks/lm_precision/simulator_lm512.json --segments -o B`` (context 512,
    prefill chunk 64, whole-stack HTP graphs not exported; 9-12 min, peak RSS 17.8 GB, 24 GB on disk). The test:
    3.5 min."""
    import gc
    import os

    from tokenizers import Tokenizer

    from kztts.bundle.bundle import Bundle
    from kztts.bundle.segments import HEAD_STATS, LAYER_STATS
    from kztts.htp.placement import builtin
    from kztts.lm import chatml
    from kztts.lm.fetch import checkpoint_path
    from kztts.lm.lm import LM
    from kztts.plan.resolve import resolve_plan

    gguf = checkpoint_path()
    if not gguf.is_file():
        pytest.skip(f"{gguf} is not in the cache: run `kztts fetch-lm` (1.1 GB)")
    bundle = os.environ.get(BUNDLE_ENV)
    if not bundle:
        pytest.skip(f"${BUNDLE_ENV} is not set: export the GGUF with --segments (see the docstring) and name it")
    b = Bundle.open(bundle, load_graphs=False)
    source = b.manifest.data["source"]
    assert source["gguf"] and Path(source["path"]).name == gguf.name, source
    tok = Tokenizer.from_file(str(Path(bundle) / "tokenizer.json"))
    ids = [tok.encode(chatml.first_turn("", t), add_special_tokens=False).ids for t in REAL_PROMPTS]

    model = load_causal_lm(gguf, tmp_path).model  # first, then freed: peak RSS 14.2 GB (21.4 GB the other way)
    mags = hook_magnitudes(model, ids)
    del model
    gc.collect()

    L = int(b.manifest.talker["num_layers"])
    talker = resolve_plan(b, placement=builtin("all-cpu", L), segments=True).open_talker()
    layers = {ph: np.zeros((L, len(LAYER_STATS))) for ph in ("prefill", "decode")}
    head = {ph: np.zeros(len(HEAD_STATS)) for ph in ("prefill", "decode")}
    rows = np.zeros(L + 1)  # prefill: max |hidden_out| of each layer, then max |logits|, over the prompt's rows

    def record(phase, unit, out):
        target = head[phase] if unit == "head" else layers[phase][unit]
        np.maximum(target, np.asarray(out["stats"], np.float64), out=target)
        if phase == "prefill":
            i = L if unit == "head" else unit
            rows[i] = max(rows[i], float(np.abs(out["logits" if unit == "head" else "hidden"]).max()))

    talker.on_unit = record
    lm = LM(b, talker=talker)
    for one in ids:
        lm._claim(object())
        lm.feed(one)  # prefill chunks (padded)
        lm._claim(object())
        for t in one:  # one position at a time: the decode graphs
            lm.feed([t])
    found = {}
    for ph in ("decode", "prefill"):
        table = [dict(zip(LAYER_STATS, map(float, row))) for row in layers[ph]]
        found[ph] = _worst(table, dict(zip(HEAD_STATS, map(float, head[ph]))), mags)
        print(f"{ph} graphs vs hooks: largest relative difference {found[ph][0]:.2e} at {found[ph][1]}; per stat "
              + ", ".join(f"{k} {v:.1e}" for k, v in found[ph][2].items()))
    residual = [float(r[LAYER_STATS.index("residual_out")]) for r in layers["decode"]]
    hook_residual = [row["residual_out"] for row in mags["layers"]]
    print("residual_out per layer, graphs / hooks: "
          + " ".join(f"{a:.0f}/{h:.0f}" for a, h in zip(residual, hook_residual)))
    want = np.array(hook_residual + [mags["head"]["logits"]])
    prefill_rows = np.abs(rows - want) / want
    print(f"prefill graphs' own rows vs hooks (residual_out per layer, logits): largest relative difference "
          f"{prefill_rows.max():.2e}")
    assert found["decode"][0] < 0.01, found["decode"]
    assert prefill_rows.max() < 0.01, prefill_rows
    assert all(3.5e3 < r < 5e3 for r in residual[2:26]), residual


def test_the_gguf_header_is_read_as_the_gguf_package_reads_it(tiny_lms, tmp_path):
    """``kztts.export.lm.gguf_meta``: the version, the tensor count and every key/value pair of the header, read
    without the ``gguf`` package (which maps every tensor); damaged headers refused in one line."""
    import struct

    import gguf

    from kztts.export.lm.gguf_meta import read_gguf_meta

    for model_type, (_, path, tensors, _) in tiny_lms.items():
        meta, reader = read_gguf_meta(path), gguf.GGUFReader(str(path))
        assert meta.version == 3 and meta.tensor_count == tensors == len(reader.tensors)
        assert meta.values["general.architecture"] == model_type
        assert set(meta.values) == set(reader.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
        assert all(reader.fields[k].contents() == v for k, v in meta.values.items())
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 a zip")
    with pytest.raises(KzttsError, match=r"x\.gguf: not a GGUF file \(no GGUF magic\)"):
        read_gguf_meta(tmp_path / "x.gguf")
    (tmp_path / "old.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(KzttsError, match=r"old\.gguf: GGUF version 1 is too old"):
        read_gguf_meta(tmp_path / "old.gguf")
    (tmp_path / "short.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 50) + b"key")
    with pytest.raises(KzttsError, match=r"short\.gguf: the GGUF header ends early"):
        read_gguf_meta(tmp_path / "short.gguf")
    (tmp_path / "new.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k"
                                        + struct.pack("<I", 99))
    with pytest.raises(KzttsError, match=r"new\.gguf: unknown GGUF value type 99"):
        read_gguf_meta(tmp_path / "new.gguf")


def test_which_lm_family_a_directory_holds(tiny_lms, tmp_path):
    """``kztts.export.lm.family.lm_model_type``: the CLI's choice between the TTS and the LM export."""
    from kztts.export.lm.family import lm_model_type

    for model_type, (directory, *_) in tiny_lms.items():
        assert lm_model_type(directory) == model_type
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_tts"}))
    assert lm_model_type(tmp_path) is None  # a TTS checkpoint
    (tmp_path / "config.json").write_text("{not json")
    assert lm_model_type(tmp_path) is None and lm_model_type(tmp_path / "missing") is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert lm_model_type(tmp_path) is None
