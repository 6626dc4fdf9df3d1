"""Every module of the package (runtime/ = ``kztts``, export/ = ``kztts.export``; not ``__init__`` or ``__main__``) is
named by at least one test file: imported (``import kztts.x.y``, ``from kztts.x import y``, ``from kztts.x.y import
z``) or written out in the test's code as its dotted name (a ``python -m kztts.x.y`` command, a monkeypatch target).
A name in a docstring or a comment does not count: it says what a test is about, not that the test touches it.

The few modules covered only indirectly are listed in ``INDIRECT`` with the reason and the test that runs them; the
list holds no module a test file names (a module that gets a test of its own leaves it)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from support import ROOT

# module -> why no test file names it, and which test runs it
INDIRECT = {
    "kztts.bench.htp_worker": (
        "the child process of one HTP row of kztts bench (python -m kztts.bench.htp_worker SPEC.json): it runs the "
        "target's static graphs on the QNN simulator against the fp32 baseline that the bench's CPU worker writes "
        "first; tests/bench/test_bench.py::test_bench_htp_simulator_row runs it through `kztts bench --target "
        "simulator` and checks its row (placement, cosines, code agreement, decoder SNR)"),
    "kztts.export.tts.bench_reference": (
        "the qwen-tts PyTorch reference row of kztts bench, in its own process (python -m "
        "kztts.export.tts.bench_reference SPEC.json, or --serve for the end-to-end row): it times the official "
        "model; tests/bench/test_bench.py::test_bench_smoke runs it through `kztts bench` and checks the reference "
        "row (its codes equal the fp32 bundle's, its cosines) and the end-to-end row"),
}


def package_modules() -> list[str]:
    """The dotted names of every module of runtime/ and export/ but ``__init__`` and ``__main__``."""
    out = []
    for folder, package in (("runtime", "kztts"), ("export", "kztts.export")):
        for f in sorted((ROOT / folder).rglob("*.py")):
            if f.stem not in ("__init__", "__main__"):
                out.append(".".join([package, *f.relative_to(ROOT / folder).with_suffix("").parts]))
    return out


def names_in(source: str) -> set[str]:
    """The kztts names a test file's code holds: what it imports, and dotted names in its strings that are not
    docstrings (comments are not in the tree)."""
    tree = ast.parse(source)
    names: set[str] = set()
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and ast.get_docstring(node, clean=False) is not None}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names |= set(re.findall(r"kztts(?:\.\w+)+", node.value))
    return names


def named_by_tests() -> set[str]:
    """What the test files name, this one aside (its list names what no test does)."""
    names: set[str] = set()
    for f in (ROOT / "tests").rglob("test_*.py"):
        if f.resolve() != Path(__file__).resolve():
            names |= names_in(f.read_text(encoding="utf-8"))
    return names


def test_every_module_is_named_by_a_test_file():
    named = named_by_tests()
    unnamed = [m for m in package_modules() if m not in named and m not in INDIRECT]
    assert not unnamed, ("modules no test file imports or names in its code (give each a test of its own in "
                         f"tests/<folder>/, or list it in INDIRECT with the reason): {unnamed}")


def test_the_indirect_list_holds_only_unnamed_modules():
    modules, named = set(package_modules()), named_by_tests()
    assert set(INDIRECT) <= modules, set(INDIRECT) - modules
    assert not set(INDIRECT) & named, f"named by a test file now: drop them from INDIRECT: {set(INDIRECT) & named}"
    assert all(len(reason) > 80 and "tests/" in reason for reason in INDIRECT.values())


def test_the_scanner_counts_code_not_docstrings_or_comments():
    planted = '''"""kztts.a.docstring"""
import kztts.a.imported
from kztts.b import c
from kztts.d.e import f as g
# kztts.a.comment


def test_x(monkeypatch):
    """kztts.a.function_docstring"""
    monkeypatch.setattr("kztts.h.i.attribute", None)
    run(["python", "-m", "kztts.j.k"])
    text = f"{1} kztts.l.m"
'''
    names = names_in(planted)
    assert {"kztts.a.imported", "kztts.b.c", "kztts.d.e", "kztts.d.e.f", "kztts.h.i.attribute", "kztts.j.k",
            "kztts.l.m"} <= names
    assert not {"kztts.a.docstring", "kztts.a.comment", "kztts.a.function_docstring"} & names
    assert len(package_modules()) > 150 and "kztts.server.app" in package_modules()
    assert "kztts.export.graphs.hybrid_graphs" in package_modules() and "kztts.cli.__main__" not in package_modules()
