"""The runtime package must work without torch: nothing under runtime/ imports it."""
from __future__ import annotations

import ast
import subprocess
import sys

from support import ROOT

RUNTIME = ROOT / "runtime"


def test_no_torch_import_statement():
    offenders = []
    for f in RUNTIME.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [f"{f.name}: {n}" for n in names
                          if n.split(".")[0] in ("torch", "transformers", "qwen_tts")]
    assert not offenders, offenders


def test_runtime_modules_import_with_torch_blocked():
    code = (
        "import sys, importlib, pkgutil\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers', 'qwen_tts'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import kztts\n"
        "n = 0\n"
        "for m in pkgutil.walk_packages(kztts.__path__, 'kztts.'):\n"
        "    if not m.name.startswith('kztts.export') and not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "        n += 1\n"
        "print('ok', n)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split()[0] == "ok", out.stderr
    assert int(out.stdout.split()[1]) > 80, out.stdout  # every module of every layer folder was imported


def test_no_generic_top_level_names_installed(tmp_path):
    """Only `kztts` is installed: the source folders `export`/`runtime` are not import names."""
    code = ("import importlib.util as u, kztts, kztts.export\n"
            "print(u.find_spec('export') is None, u.find_spec('runtime') is None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


# Tooling that must stay at the edge: `import kztts` and a synthesis never load it.
TOOLING = ("kztts.bench", "kztts.eval", "kztts.cli", "kztts.export", "kztts.core.worker_process")


def test_the_front_door_loads_nothing_heavy(tmp_path):
    """``import kztts`` loads no numpy, ONNX Runtime or torch; ``from kztts import TTS, LM, Voice,
    KzttsError`` works (loaded then); an unknown name is an AttributeError."""
    code = ("import sys, kztts\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'onnxruntime', 'torch')))\n"
            "from kztts import TTS, LM, Voice, KzttsError, SynthesisRequest\n"
            "print(TTS.__module__, LM.__module__, Voice.__module__, KzttsError.__module__)\n"
            "print('onnxruntime' in sys.modules, hasattr(kztts, 'Nope'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "kztts.tts.tts kztts.lm.lm kztts.tts.request kztts.core.errors",
                                       "True False"]


def test_import_and_synthesis_load_no_tooling_and_no_torch(tmp_path):
    """`import kztts` and one CPU `TTS(...).synthesize` import neither the bench, calibration,
    validation, CLI or export modules, nor torch (nor onnx / matplotlib)."""
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    bundle = cached_bundle(cached_tiny("equal"))
    code = (
        "import sys, numpy as np\n"
        "import kztts\n"
        "after_import = set(sys.modules)\n"
        "from kztts import TTS, Voice\n"
        f"t = TTS({str(bundle)!r})\n"
        "r = t.synthesize('Hi there.', Voice(np.zeros(t.speaker_size, np.float32)), greedy=True, max_frames=3)\n"
        "assert r.frames == 3 and r.samples.size == 3 * 1920\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({TOOLING!r}) or m.split('.')[0] in "
        "('torch', 'transformers', 'qwen_tts', 'onnx', 'matplotlib', 'onnxruntime_qnn'))\n"
        "print('import:', sorted(m for m in after_import if m.startswith('kztts')))\n"
        "print('BAD', bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BAD []" in out.stdout, out.stdout
    assert "import: ['kztts', 'kztts.core', 'kztts.core.errors']" in out.stdout, out.stdout
