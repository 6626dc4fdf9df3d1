"""Who may import whom, by folder (each folder's ``__init__`` docstring says it): a module imports
its own folder and the layers below it, never a layer above or beside it; nothing imports the CLI;
there is no import cycle; and imports of kztts sit at module top, but for the exporter (torch is an
optional extra) where the runtime's tooling calls it."""
from __future__ import annotations

import ast
from pathlib import Path

from support import ROOT


# The layers, lowest first. Folders of one rank (tts, lm; export.tts, export.lm) are siblings: neither imports the
# other.
RANKS = {
    "kztts.core": 0, "kztts.bundle": 1, "kztts.generation": 2, "kztts.htp": 3, "kztts.runners": 4,
    "kztts.plan": 5, "kztts.tts.text": 5.5, "kztts.tts": 6, "kztts.lm": 6, "kztts.assistant": 6.4, "kztts.eval": 7,
    "kztts.server": 6.5,
    "kztts.export.common": 8.0, "kztts.export.graphs": 8.1, "kztts.export.htp": 8.2, "kztts.export.tts": 8.3,
    "kztts.export.lm": 8.3, "kztts.export.validate": 8.5,
    "kztts.bench": 9, "kztts.cli": 10,
}
FRONT_DOOR = {"kztts": 0.5, "kztts.export": 8.0}  # the packages' own __init__: above core, below the rest
MAX_MODULES = 15  # a folder a reader takes in at a glance


def folder(module: str) -> str:
    """The layer folder of a module (the longest ``RANKS`` prefix)."""
    best = max((f for f in RANKS if module == f or module.startswith(f + ".")), key=len, default=None)
    if best is None:
        raise AssertionError(f"{module} lies in no layer folder: add its folder to RANKS and DESIGN")
    return best


def rank(module: str) -> float:
    return FRONT_DOOR[module] if module in FRONT_DOOR else RANKS[folder(module)]


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, root in (("kztts", ROOT / "runtime"), ("kztts.export", ROOT / "export")):
        for f in root.rglob("*.py"):
            parts = [p for p in f.relative_to(root).with_suffix("").parts if p != "__init__"]
            if pkg == "kztts" and parts[:1] == ["export"]:
                continue
            mods[".".join([pkg, *parts])] = f
    return mods


def _imports(path: Path, known: set[str]) -> dict[str, bool]:
    """{imported kztts module: at module top} (a module imported both ways counts as at top)."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body} | {id(c) for n in tree.body if isinstance(n, (ast.If, ast.Try))
                                         for c in ast.walk(n)}
    out: dict[str, bool] = {}
    for node in ast.walk(tree):
        names: set[str] = set()
        if isinstance(node, ast.Import):
            names = {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        for m in names & known:
            out[m] = out.get(m, False) or id(node) in top
    return out


def _graph() -> dict[str, dict[str, bool]]:
    mods = _modules()
    known = set(mods)
    graph = {}
    for m, f in mods.items():
        deps = _imports(f, known)
        deps.pop(m, None)
        # `from kztts.x import y` names the package kztts.x too: the package itself is not an import
        graph[m] = {d: t for d, t in deps.items() if not (mods[d].name == "__init__.py" and any(
            o.startswith(d + ".") for o in deps))}
    return graph


def layer_breaches(graph: dict[str, dict[str, bool]]) -> list[str]:
    bad = []
    for m, deps in graph.items():
        for d in deps:
            same = m not in FRONT_DOOR and d not in FRONT_DOOR and folder(m) == folder(d)
            if d.startswith("kztts.cli") and not m.startswith("kztts.cli"):
                bad.append(f"{m} imports the command line {d}")
            elif not same and rank(d) >= rank(m) and d not in ("kztts", "kztts.export"):
                bad.append(f"{m} ({folder(m) if m not in FRONT_DOOR else m}) imports {d} (a layer "
                           f"{'beside' if rank(d) == rank(m) else 'above'} it)")
    return bad


def deferred_imports(graph: dict[str, dict[str, bool]]) -> list[str]:
    """Imports of kztts inside functions, but for the runtime calling the exporter (torch)."""
    return [f"{m} imports {d} inside a function" for m, deps in graph.items() for d, at_top in deps.items()
            if not at_top and not (d.startswith("kztts.export") and not m.startswith("kztts.export"))]


def test_layers():
    bad = layer_breaches(_graph())
    assert not bad, "\n".join(sorted(bad))


def test_imports_at_module_top():
    bad = deferred_imports(_graph())
    assert not bad, "\n".join(sorted(bad))


def test_folders_stay_small():
    counts: dict[str, int] = {}
    for m in _modules():
        if m not in FRONT_DOOR and not m.endswith(tuple(RANKS)):
            counts[folder(m)] = counts.get(folder(m), 0) + 1
    big = {f: n for f, n in counts.items() if n > MAX_MODULES}
    assert not big, big


def test_no_import_cycles():
    g = {m: set(deps) for m, deps in _graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [m, d]) if d in stack else f"{m} -> {d}")
            elif d not in state:
                visit(d, stack + [m])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)


def test_the_checks_see_planted_breaches():
    """The checker itself: a layer importing one above it, one beside it, the CLI, a deferred import
    and a cycle are each found."""
    g = {"kztts.tts.tts": {"kztts.bench.worker": True, "kztts.lm.lm": True},
         "kztts.runners.talker": {"kztts.cli.main": True, "kztts.core.errors": False},
         "kztts.bench.worker": {"kztts.tts.tts": True, "kztts.export.tts.tiny": False},
         "kztts.export.lm.tiny": {"kztts.export.tts.tiny": True}}
    breaches = layer_breaches(g)
    assert "kztts.tts.tts (kztts.tts) imports kztts.bench.worker (a layer above it)" in breaches
    assert "kztts.tts.tts (kztts.tts) imports kztts.lm.lm (a layer beside it)" in breaches
    assert "kztts.runners.talker imports the command line kztts.cli.main" in breaches
    assert not [b for b in breaches if b.startswith("kztts.bench.worker")]
    assert ("kztts.export.lm.tiny (kztts.export.lm) imports kztts.export.tts.tiny (a layer beside it)"
            in breaches)
    assert deferred_imports(g) == ["kztts.runners.talker imports kztts.core.errors inside a function"]
    import sys

    module = sys.modules[__name__]
    real = module._graph
    module._graph = lambda: g
    try:
        test_no_import_cycles()
    except AssertionError as exc:
        assert "kztts.bench.worker" in str(exc) and "kztts.tts.tts" in str(exc)
    else:
        raise AssertionError("the cycle check missed a cycle")
    finally:
        module._graph = real
