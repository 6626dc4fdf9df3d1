"""Who may import whom (docs/DESIGN.md, "Map"): base modules import only base modules, the runtime
never imports the tooling or the exporter, nothing imports the CLI entry point, and there is no
import cycle, counting the imports inside functions too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = {"kztts", "kztts.errors", "kztts.env", "kztts.atomic", "kztts.progress", "kztts.graphs", "kztts.manifest",
        "kztts.cache", "kztts.rope", "kztts.segments", "kztts.sampling_chain", "kztts.build_cache"}
TOOLING = ("kztts.cli", "kztts.calibrate", "kztts.bench", "kztts.validation", "kztts.worker_process", "kztts.replay",
           "kztts.lm_accuracy", "kztts.export")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in (("kztts", ROOT / "runtime"), ("kztts.export", ROOT / "export")):
        for f in folder.rglob("*.py"):
            parts = [p for p in f.relative_to(folder).with_suffix("").parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = f
    return mods


def _imports(path: Path, known: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m in known}


def _tooling(name: str) -> bool:
    return any(name == t or name.startswith(t + ".") or (t == "kztts.cli" and name.startswith("kztts.cli_"))
               for t in TOOLING)


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(f, set(mods)) - {m} for m, f in mods.items()}


def test_layers():
    g = _graph()
    bad = []
    for m, deps in g.items():
        if m in BASE:
            bad += [f"{m} (base) imports {d}" for d in deps if d not in BASE]
        elif not _tooling(m):
            bad += [f"{m} (runtime) imports {d}" for d in deps if _tooling(d)]
        bad += [f"{m} imports the entry point kztts.cli" for d in deps if d == "kztts.cli"]
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    g = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(g[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [m, d]) if d in stack else f"{m} -> {d}")
            elif d not in state:
                visit(d, stack + [m])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)


def test_the_checks_see_a_planted_cycle_and_layer_breach(monkeypatch):
    """The checker itself: a runtime module importing the bench, and a two-module cycle, are found."""
    import sys

    g = {"kztts.tts": {"kztts.bench.worker"}, "kztts.bench.worker": {"kztts.tts"}}
    monkeypatch.setattr(sys.modules[__name__], "_graph", lambda: g)
    try:
        test_layers()
    except AssertionError as exc:
        assert "kztts.tts (runtime) imports kztts.bench.worker" in str(exc)
    else:
        raise AssertionError("the layer check missed a runtime -> tooling import")
    try:
        test_no_import_cycles()
    except AssertionError as exc:
        assert "kztts.bench.worker" in str(exc) and "kztts.tts" in str(exc)
    else:
        raise AssertionError("the cycle check missed a cycle")
