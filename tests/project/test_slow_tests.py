"""Every ``slow`` test is listed in tests/slow_tests.py with its reason and measured time, and every listed one
exists and is slow: the default suite leaves them out, CI's second stage (.ci/run) runs them all."""
from __future__ import annotations

import ast
from pathlib import Path

from slow_tests import SLOW_TESTS

from support import ROOT


def _is_slow(node: ast.expr) -> bool:
    """``pytest.mark.slow`` (or the call ``pytest.mark.slow(...)``)."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "slow" and isinstance(node.value, ast.Attribute) \
        and node.value.attr == "mark"


def _slow_params(decorator: ast.expr) -> list[str]:
    """The ids of a ``parametrize`` decorator's ``pytest.param(VALUE, marks=pytest.mark.slow)`` entries."""
    if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "parametrize" and len(decorator.args) > 1):
        return []
    ids = []
    for elt in getattr(decorator.args[1], "elts", []):
        if isinstance(elt, ast.Call) and getattr(elt.func, "attr", "") == "param":
            marks = [k.value for k in elt.keywords if k.arg == "marks"]
            if any(_is_slow(m) or any(_is_slow(e) for e in getattr(m, "elts", [])) for m in marks):
                ids.append(str(ast.literal_eval(elt.args[0])))
    return ids


def slow_tests_in(root: Path) -> set[str]:
    """The node ids of the slow tests under ``root``/tests, read from the source: ``path::test`` for a test marked
    slow (module ``pytestmark`` included), ``path::test[id]`` for a slow parameter."""
    found = set()
    for path in sorted((root / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(root).as_posix()
        module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                          and (_is_slow(n.value) or any(_is_slow(e) for e in getattr(n.value, "elts", [])))
                          for n in tree.body)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if module_slow or any(_is_slow(d) for d in node.decorator_list):
                    found.add(f"{rel}::{node.name}")
                for d in node.decorator_list:
                    found.update(f"{rel}::{node.name}[{i}]" for i in _slow_params(d))
    return found


def test_every_slow_test_is_listed_with_its_reason_and_time_and_every_listed_one_exists():
    found = slow_tests_in(ROOT)
    unlisted, gone = sorted(found - set(SLOW_TESTS)), sorted(set(SLOW_TESTS) - found)
    assert not unlisted, f"slow tests not in tests/slow_tests.py (add each with its reason and time): {unlisted}"
    assert not gone, f"tests/slow_tests.py lists tests that are not slow or not there: {gone}"
    for test, (reason, seconds, measured) in SLOW_TESTS.items():
        assert len(reason) > 20 and measured, test
        assert (seconds is None) == (measured == "not measured yet") and (seconds is None or seconds > 0), test


def test_the_scan_finds_each_way_of_marking_a_test_slow(tmp_path):
    """The scan above against a file that marks a test slow each way, and one that is not slow."""
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.slow  # why\n"
        "def test_whole(): pass\n"
        "@pytest.mark.parametrize('p', ['fast', pytest.param('big', marks=pytest.mark.slow)])\n"
        "def test_param(p): pass\n"
        "def test_fast(): pass\n")
    (tmp_path / "tests" / "test_y.py").write_text("import pytest\npytestmark = [pytest.mark.slow]\ndef test_all(): pass\n")
    assert slow_tests_in(tmp_path) == {"tests/a/test_x.py::test_whole", "tests/a/test_x.py::test_param[big]",
                                       "tests/test_y.py::test_all"}
