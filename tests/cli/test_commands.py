"""What the command line does that no other test ran: the README's demo command and ``--model``,
``--preset windowed-penalty``, sampling overrides (flag > environment variable > default), ``--pipeline``,
``export --overwrite`` and the cleanup of a failed export, QNN's per-graph CPU fallback and
``KZTTS_DISABLE_QNN``, and the printed (non-JSON) reports of ``inspect`` and ``validate`` (slow).

In-process through ``kztts.cli.main.main`` on the cached tiny model and bundles (each check is cheap;
the export checks replace the graph exporters, whose output other tests check, by stubs)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from kztts.core.audio import read_wav, synthetic_voice
from kztts.core.errors import KzttsError

from support import kztts_main

TEXT = "Hello world, this is a tiny test."
FRAMES = 6
on_equal = pytest.mark.parametrize("variant", ["equal"], indirect=True)  # the demo's model


_OPENED: dict = {}
# what ``kztts synth`` passes to TTS without options (the API then shares the CLI's opened TTS)
SYNTH_OPTIONS = dict(cp_mode="frame", target=None, strict=False, placement=None, session_config=None, pipeline=False)


@pytest.fixture
def shared_tts(monkeypatch):
    """``kztts.tts.tts.TTS`` opened once per bundle and options in this module (the CLI's calls too):
    opening a tiny bundle's sessions takes ~4 s, a synthesis of a few frames ~0.2 s, and a ``TTS``
    keeps no state from one synthesis to the next."""
    import kztts.cli.synth
    import kztts.tts.tts

    real = kztts.tts.tts.TTS

    def opened(bundle, **options):
        key = (str(Path(bundle).resolve()), repr(sorted(options.items())))
        if key not in _OPENED:
            _OPENED[key] = real(bundle, **options)
        return _OPENED[key]

    monkeypatch.setattr(kztts.cli.synth, "TTS", opened)
    return opened


def synth_codes(capsys, tmp_path, *flags, name: str = "out") -> np.ndarray:
    """The codes of ``kztts synth TEXT FLAGS`` ("-o" and "--codes-out" in ``tmp_path``), which must succeed."""
    wav, codes = tmp_path / f"{name}.wav", tmp_path / f"{name}.npy"
    code, out, err = kztts_main(capsys, "synth", TEXT, "-o", wav, "--codes-out", codes, *flags)
    assert code == 0, err
    assert out.startswith(f"{wav}: ")
    return np.load(codes)


# ------------------------------------------------------------------ the README's commands
@on_equal
def test_readme_first_command_speaks_with_the_demo_model(tiny_bundle_dir, shared_tts, tmp_path, monkeypatch, capsys):
    """``kztts synth "Hello from kztts." -o hello.wav``: no model, no voice: the demo (the cached export
    of the tiny 'equal' model) with the synthetic voice. Limited to a few frames here: the limit only
    cuts, a sampled run's first frames do not depend on it (test_demo_golden runs it to its end)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = kztts_main(capsys, "synth", "Hello from kztts.", "-o", "hello.wav", "--max-frames", 6,
                         "--codes-out", "codes.npy")
    assert code == 0, err
    assert "using the embedded demo model (tiny, RANDOM weights" in err
    wav, sr = sf.read("hello.wav", dtype="float32")
    assert sr == 24000 and wav.shape == (6 * 1920,) and np.abs(wav).max() > 0
    # --max-frames cut the utterance before its end of speech: said on the summary line and stderr
    assert out.splitlines()[0] == "hello.wav: 6 frames, 0.48 s of audio (1 cut short by a limit: see the warnings)"
    tts = shared_tts(tiny_bundle_dir, **SYNTH_OPTIONS)
    want = tts.synthesize("Hello from kztts.", tts.voice_from_wav(synthetic_voice(), 24000), max_frames=6, seed=0)
    np.testing.assert_array_equal(np.load("codes.npy"), want.codes)


@on_equal
def test_model_flag_uses_the_cached_export_of_the_checkpoint(tiny_model_dir, tiny_bundle_dir, shared_tts, voice_wav,
                                                            tmp_path, capsys):
    common = ("--speaker-wav", voice_wav, "--greedy", "--max-frames", FRAMES)
    by_model = synth_codes(capsys, tmp_path, "--model", tiny_model_dir, *common, name="model")
    by_bundle = synth_codes(capsys, tmp_path, "--bundle", tiny_bundle_dir, *common, name="bundle")
    np.testing.assert_array_equal(by_model, by_bundle)


# ------------------------------------------------------------------ sampling settings from the command line
@pytest.fixture
def bundle_args(tiny_bundle_dir, voice_wav, shared_tts):
    return ("--bundle", tiny_bundle_dir, "--speaker-wav", voice_wav, "--max-frames", FRAMES, "--seed", 0)


@on_equal
def test_windowed_penalty_preset_and_its_former_name(tiny_bundle_dir, bundle_args, shared_tts, tmp_path, capsys):
    from dataclasses import replace

    from kztts.generation.settings import windowed_penalty_preset

    reference = synth_codes(capsys, tmp_path, *bundle_args, name="reference")
    windowed = synth_codes(capsys, tmp_path, *bundle_args, "--preset", "windowed-penalty", name="windowed")
    assert not np.array_equal(windowed, reference)  # the Code Predictor's repetition penalty changes the draws
    tts = shared_tts(tiny_bundle_dir, **SYNTH_OPTIONS)
    settings = replace(windowed_penalty_preset(tts.bundle.manifest.generation), max_frames=FRAMES)
    want = tts.synthesize(TEXT, tts.voice_from_wav(*read_wav(bundle_args[3])), seed=0, settings=settings)
    np.testing.assert_array_equal(windowed, want.codes)
    former = synth_codes(capsys, tmp_path, *bundle_args, "--preset", "seed", name="former")  # still accepted
    np.testing.assert_array_equal(former, windowed)


@on_equal
def test_sampling_flag_beats_environment_beats_default(bundle_args, tmp_path, capsys, monkeypatch):
    """Which value took effect shows in the codes: the Talker's temperature 5 (default 0.9) changes its
    CB0 draws, the Code Predictor's top-k 1 (default 50) makes it greedy."""
    default = synth_codes(capsys, tmp_path, *bundle_args, name="default")
    flags = synth_codes(capsys, tmp_path, *bundle_args, "--temperature", 5, "--cp-top-k", 1, name="flags")
    assert not np.array_equal(flags[:, 0], default[:, 0]) and not np.array_equal(flags[:, 1:], default[:, 1:])
    monkeypatch.setenv("KZTTS_TEMP", "5")
    monkeypatch.setenv("KZTTS_CP_TOPK", "1")
    np.testing.assert_array_equal(synth_codes(capsys, tmp_path, *bundle_args, name="env"), flags)
    both = synth_codes(capsys, tmp_path, *bundle_args, "--temperature", 0.9, "--cp-top-k", 50, name="both")
    np.testing.assert_array_equal(both, default)
    # one variable per generator: the Talker's alone leaves the Code Predictor sampling
    monkeypatch.delenv("KZTTS_CP_TOPK")
    talker_only = synth_codes(capsys, tmp_path, *bundle_args, name="talker")
    assert not np.array_equal(talker_only[:, 0], default[:, 0]) and not np.array_equal(talker_only, flags)
    monkeypatch.setenv("KZTTS_TOPK", "0.5")
    code, _, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "bad.wav", *bundle_args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "KZTTS_TOPK='0.5'" in err, err


@on_equal
def test_pipeline_flag_decodes_on_a_background_thread_with_the_same_output(bundle_args, tmp_path, capsys,
                                                                          monkeypatch):
    import kztts.tts.streaming
    from kztts.runners.codec import BackgroundDecoder

    made = []

    class Recorded(BackgroundDecoder):
        def __init__(self, *args, **kwargs):
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(kztts.tts.streaming, "BackgroundDecoder", Recorded)
    plain = synth_codes(capsys, tmp_path, *bundle_args, "--stream", name="plain")
    assert made == []
    piped = synth_codes(capsys, tmp_path, *bundle_args, "--stream", "--pipeline", name="piped")
    assert len(made) == 1
    np.testing.assert_array_equal(piped, plain)
    assert (tmp_path / "piped.wav").read_bytes() == (tmp_path / "plain.wav").read_bytes()
    code, _, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "x.wav", *bundle_args, "--pipeline")
    assert code == 2 and "--pipeline needs --stream" in err and not (tmp_path / "x.wav").exists()


# ------------------------------------------------------------------ export: --overwrite, and a failure leaves nothing
class _StubGraph:
    """What a graph exporter returns, for a graph the stub did not really export."""

    def __init__(self, name: str):
        self.name = name

    def to_json(self) -> dict:
        return {"file": f"graphs/{self.name}.stub", "stub": True}


@pytest.fixture
def quick_export(monkeypatch, reference):
    """``export_bundle`` with its graph and tokenizer exporters replaced by stubs writing one small file
    each (so nothing to share in a weights file), and the checkpoint loaded once per session (the ``reference`` fixture, what load_reference
    returns): the checkpoint is still hashed, the embeddings and the manifest still written. What is
    tested is where the bundle goes, not the graphs (other tests check those). Returns the stub calls."""
    from kztts.export.tts import bundle_writer

    calls: list[str] = []

    def stub(name):
        def write(model, work, export_id):
            calls.append(name)
            (work / "graphs").mkdir(exist_ok=True)
            (work / "graphs" / f"{name}.stub").write_text(export_id)
            return _StubGraph(name) if name == "talker" else {name: _StubGraph(name)}
        return write

    monkeypatch.setattr(bundle_writer, "load_reference", lambda model_dir, **_: reference)
    monkeypatch.setattr(bundle_writer, "export_talker", stub("talker"))
    monkeypatch.setattr(bundle_writer, "export_tokenizer",
                        lambda model_dir, work: (work / "tokenizer.json").write_text("{}"))
    for name in ("export_code_predictor", "export_gqa_graphs", "export_decoder", "export_encoder",
                 "export_speaker_encoder"):
        monkeypatch.setattr(bundle_writer, name, stub(name))
    monkeypatch.setattr(bundle_writer, "share_graph_weights", lambda work, graphs: (graphs, None))  # no ONNX files
    return calls


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("variant", ["proj"], indirect=True)
def test_export_overwrite_replaces_the_folder(tiny_model_dir, tiny_bundle_dir, tmp_path, quick_export, capsys):
    out = tmp_path / "b"
    out.mkdir()
    (out / "old.txt").write_text("old")
    code, _, err = kztts_main(capsys, "export", tiny_model_dir, "-o", out)
    assert code == 2 and "exists and is not empty; choose another -o or pass --overwrite" in err
    assert quick_export == [] and (out / "old.txt").exists()  # refused before any work
    code, stdout, err = kztts_main(capsys, "export", tiny_model_dir, "-o", out, "--overwrite")
    assert code == 0, err
    assert stdout.strip() == str(out)
    assert not (out / "old.txt").exists() and (out / "graphs" / "talker.stub").is_file()
    assert quick_export == ["talker", "export_code_predictor", "export_gqa_graphs", "export_decoder",
                            "export_encoder", "export_speaker_encoder"]
    source = json.loads((out / "kztts.json").read_text())["source"]
    assert source == json.loads((tiny_bundle_dir / "kztts.json").read_text())["source"]  # that checkpoint's hash
    assert _leftovers(tmp_path) == ["b"]  # no staging folder left next to it


@pytest.mark.parametrize("variant", ["proj"], indirect=True)
def test_export_failing_midway_leaves_nothing_behind(tiny_model_dir, tmp_path, quick_export, capsys, monkeypatch):
    import errno

    from kztts.export.tts import bundle_writer

    def disk_full(model, work, export_id):
        (work / "graphs" / "decoder.onnx").write_bytes(b"half a graph")
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr(bundle_writer, "export_decoder", disk_full)
    code, _, err = kztts_main(capsys, "export", tiny_model_dir, "-o", tmp_path / "new")
    assert code == 2 and "no space left on the device" in err and "Traceback" not in err
    assert "export_gqa_graphs" in quick_export  # it failed midway, after graphs were written
    assert _leftovers(tmp_path) == []  # neither the bundle nor its staging folder
    # over an existing bundle with --overwrite: the old one stays as it was
    old = tmp_path / "old"
    old.mkdir()
    (old / "kztts.json").write_text("{}")
    code, _, err = kztts_main(capsys, "export", tiny_model_dir, "-o", old, "--overwrite")
    assert code == 2 and "no space left on the device" in err
    assert _leftovers(tmp_path) == ["old"] and _leftovers(old) == ["kztts.json"]


# ------------------------------------------------------------------ QNN: per-graph CPU fallback, KZTTS_DISABLE_QNN
@pytest.fixture
def qnn_here():
    """The QNN EP registered in this process (skips, saying why, when it cannot be)."""
    pytest.importorskip("onnxruntime_qnn", reason="onnxruntime-qnn is not installed: pip install 'kztts[qnn]'")
    from kztts.htp.qnn import qnn_available, qnn_unavailable_reason

    if not qnn_available():
        pytest.skip(f"the QNN EP cannot run here: {qnn_unavailable_reason()}")


def _two_op_model(path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
             helper.make_node("Add", ["r", "x"], ["y"], name="add0")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]),
              str(path))
    return path


def test_a_graph_qnn_cannot_prepare_runs_on_the_cpu_unless_strict(qnn_here, small_target, tmp_path, monkeypatch,
                                                                   caplog):
    """Per graph: the one the HTP backend refuses (injected) opens on the CPU EP with a warning naming
    it; the other one still opens on QNN; in strict mode the refusal is an error naming the file."""
    import onnxruntime as ort

    from kztts.htp import qnn
    from kztts.htp.targets import load_target

    bad, good = _two_op_model(tmp_path / "refused.onnx"), _two_op_model(tmp_path / "fine.onnx")
    real = ort.InferenceSession

    def htp_refuses_one(path, sess_options=None, providers=None, **kw):
        if providers is None and str(path).endswith("refused.onnx"):  # the QNN session of that graph
            raise RuntimeError("QNN graph finalize failed (injected)\nsecond line")
        return real(path, sess_options=sess_options, providers=providers, **kw)

    monkeypatch.setattr(qnn.ort, "InferenceSession", htp_refuses_one)
    with caplog.at_level(logging.WARNING, logger="kztts.htp.qnn"):
        on_cpu = qnn.create_session(bad, load_target(small_target))
        on_htp = qnn.create_session(good, load_target(small_target))
    assert on_cpu.get_providers() == ["CPUExecutionProvider"]
    assert qnn.EP_NAME in on_htp.get_providers() and qnn.Placement.of(on_htp).qnn_nodes == 2
    warned = [r.getMessage() for r in caplog.records if r.name == "kztts.htp.qnn"]
    assert len(warned) == 1 and warned[0].startswith("refused.onnx: the QNN execution provider could not prepare "
                                                     "this graph for target 'simulator' (QNN graph finalize "
                                                     "failed (injected)); running it on the CPU execution provider")
    x = np.arange(-4, 4, dtype=np.float32)[None]
    np.testing.assert_array_equal(on_cpu.run(None, {"x": x})[0], np.maximum(x, 0) + x)
    with pytest.raises(KzttsError, match=r"refused.onnx: the QNN execution provider could not create a session "
                                         r"for target 'simulator': QNN graph finalize failed \(injected\)$"):
        qnn.create_session(bad, load_target(small_target), strict=True)


@pytest.mark.parametrize("variant", ["proj"], indirect=True)
def test_disable_qnn_runs_everything_on_the_cpu(tiny_model_dir, small_target, voice_wav, tmp_path, monkeypatch,
                                                caplog, capsys):
    """``KZTTS_DISABLE_QNN=1``: a target's HTP graphs run on the CPU EP after one warning; strict mode
    refuses in one line that names the variable. ``0`` or empty leave QNN enabled."""
    from kztts.bundle.bundle import Bundle
    from kztts.export.tts.bundle_writer import cached_target_bundle
    from kztts.htp import qnn
    from kztts.htp.targets import load_target
    from kztts.plan.resolve import resolve_plan

    htp_bundle = cached_target_bundle(tiny_model_dir, small_target)
    model = _two_op_model(tmp_path / "m.onnx")
    for value, disabled in (("1", True), ("0", False), ("", False)):
        monkeypatch.setattr(qnn, "_STATE", qnn._State())  # the variable is read once per process
        monkeypatch.setenv("KZTTS_DISABLE_QNN", value)
        assert (qnn.qnn_unavailable_reason() == "disabled by KZTTS_DISABLE_QNN") is disabled, value
    monkeypatch.setattr(qnn, "_STATE", qnn._State())
    monkeypatch.setenv("KZTTS_DISABLE_QNN", "1")
    plan = resolve_plan(Bundle.open(htp_bundle, load_graphs=False), target=str(small_target))
    on_htp = [g for s in plan.steps.values() if s.device == "htp" for g in s.graphs]
    assert {"talker_prefill", "talker_decode", "cp_frame"} <= set(on_htp)  # the plan still says HTP
    with caplog.at_level(logging.WARNING, logger="kztts.htp.qnn"):
        opened = {g: plan.session(g).get_providers() for g in on_htp}
        qnn.create_session(model, load_target(small_target))
    assert set(map(tuple, opened.values())) == {("CPUExecutionProvider",)}, opened  # every one on the CPU EP
    warned = [r.getMessage() for r in caplog.records if "QNN execution provider unavailable" in r.getMessage()]
    assert warned == ["QNN execution provider unavailable: disabled by KZTTS_DISABLE_QNN; running on the CPU "
                      "execution provider instead"]
    code, _, err = kztts_main(capsys, "synth", TEXT, "-o", tmp_path / "s.wav", "--bundle", htp_bundle, "--target",
                       small_target, "--strict", "--speaker-wav", voice_wav, "--max-frames", 2)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "strict mode: the QNN execution provider is unavailable (disabled by KZTTS_DISABLE_QNN)" in err
    assert not (tmp_path / "s.wav").exists()


# ------------------------------------------------------------------ printed reports
def two_graph_bundle(bundle, folder, graphs: tuple[str, ...]):
    """``bundle`` with only ``graphs`` in its manifest (the files are links): inspecting it opens two
    graphs instead of every one, which takes most of the time."""
    folder.mkdir()
    for p in bundle.iterdir():
        if p.name != "kztts.json":
            (folder / p.name).symlink_to(p)
    manifest = json.loads((bundle / "kztts.json").read_text())
    manifest["graphs"] = {k: v for k, v in manifest["graphs"].items() if k in graphs}
    (folder / "kztts.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("variant", ["proj"], indirect=True)
def test_inspect_prints_a_row_per_graph(tiny_bundle_dir, small_target, tmp_path, capsys, monkeypatch):
    """The text form of ``kztts inspect BUNDLE --target T --profile`` (each graph opened) against its JSON form,
    on a CPU export's static ``cp_frame`` and dynamic Talker graphs. With QNN disabled, so that nothing is compiled
    for the simulator (~15 s per graph): the header says so and the static graph runs on the CPU EP. Without
    ``--profile`` the rows say where the plan runs each graph, read from the files."""
    from kztts.htp import qnn

    monkeypatch.setattr(qnn, "_STATE", qnn._State())
    monkeypatch.setenv("KZTTS_DISABLE_QNN", "1")
    bundle = two_graph_bundle(tiny_bundle_dir, tmp_path / "b", ("talker", "cp_frame"))
    code, read, err = kztts_main(capsys, "inspect", bundle, "--target", small_target)
    assert code == 0, err
    rows = {ln.split()[0]: ln.split()[5:] for ln in read.split("\n\n")[0].splitlines()[5:-1]}
    assert rows == {"talker": ["cpu", "fp32", "(cpu)"], "cp_frame": ["cpu", "fp32", "(cpu)"]}, read
    code, out, err = kztts_main(capsys, "inspect", bundle, "--target", small_target, "--profile")
    assert code == 0, err
    assert out.split("\n\n", 1)[1] == read.split("\n\n", 1)[1]  # the same cost, read or profiled
    code, js, err = kztts_main(capsys, "inspect", bundle, "--target", small_target, "--json", "--profile")
    assert code == 0, err
    report = json.loads(js)
    lines = out.splitlines()
    assert lines[0] == "target simulator (SC8380XP); QNN unavailable: disabled by KZTTS_DISABLE_QNN"
    # two graphs of a Base bundle, no speaker encoder among them: it takes saved voices, not recordings
    assert lines[1].startswith("kind: Base 1.7B (base); it speaks a saved voice")
    assert lines[2] == "instruction: not accepted"
    assert report["accepts"]["kind"] == "base" and report["accepts"]["speakers"] == {}
    del lines[1:3]  # what the bundle accepts (tests/tts/test_model_kinds.py checks the other kinds)
    assert lines[1] == "random weights (kztts make-tiny, size tiny, seed 1234): not a real checkpoint"
    assert report["random_weights"]["made_by"] == "kztts make-tiny"
    assert lines[2].split() == ["graph", "variant", "attention", "size", "QNN", "CPU", "precision", "CPU", "op",
                                "types"]
    rows = {ln.split()[0]: ln.split() for ln in lines[3:lines.index("")]}  # the cost section follows
    assert sorted(rows) == sorted(g["graph"] for g in report["graphs"]) == ["cp_frame", "talker"]
    for g in report["graphs"]:
        size = f"{g['bytes'] / 2**20:.1f} MB" if g["bytes"] >= 2**20 else f"{g['bytes'] / 2**10:.0f} kB"
        assert rows[g["graph"]] == [g["graph"], g["variant"], g["attention"], *size.split(), "0", str(g["cpu_nodes"]),
                                    "fp32", "(cpu)", "(all)"]
        assert g["precision"] == "fp32 (cpu)" and g["cpu_nodes"] > 50
    assert rows["cp_frame"][1] == "static" and rows["talker"][1] == "dynamic"


@pytest.mark.slow  # ~20 s: qwen-tts replays 8 prompts (tests/cli/test_tiny_export_validate.py checks the --json form by default)
@pytest.mark.parametrize("variant", ["proj"], indirect=True)
def test_validate_prints_a_table_and_pass(tiny_model_dir, tiny_bundle_dir, capsys):
    code, out, err = kztts_main(capsys, "validate", tiny_bundle_dir, "--reference", tiny_model_dir, "--frames", 2)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["mode", "language", "prompt", "frames"] and lines[-1] == "PASS"
    modes = [ln.split() for ln in lines[1:] if ln.split() and ln.split()[0].startswith(("xvec_", "icl_"))]
    assert sorted(m[0] for m in modes) == sorted(["xvec_stream", "xvec_nonstream", "icl_stream", "icl_nonstream"] * 2)
    for m in modes:
        assert int(m[3]) >= 2 and float(m[5]) >= 0.99999 and float(m[7]) == 1.0, m  # logits cos, argmax
    metrics = {ln.split()[0]: ln for ln in lines if ln.split() and ln.split()[0] in ("talker_logits_cos_min",
                                                                                    "cp_codes_match")}
    assert metrics["talker_logits_cos_min"].endswith(": ok)") and metrics["cp_codes_match"].endswith(": ok)")
