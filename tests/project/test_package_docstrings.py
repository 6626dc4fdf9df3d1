"""Each package's ``__init__`` docstring names every module and subpackage in its folder (runtime/*/,
export/*/ and the two roots), so the docstring a reader opens first is a true map of the folder."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from support import ROOT

PACKAGES = sorted(p.parent for base in ("runtime", "export") for p in (ROOT / base).rglob("__init__.py"))


def unnamed(package: Path) -> list[str]:
    """The modules and subpackages of ``package`` its docstring does not name (as a whole word)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    names = [p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    names += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(n for n in names if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", doc))


def test_the_check_sees_a_module_left_out(tmp_path):
    (tmp_path / "__init__.py").write_text('"""Holds ``alpha`` and the alpha_beta helpers."""\n')
    for name in ("alpha.py", "alpha_beta.py", "beta.py", "__main__.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    assert unnamed(tmp_path) == ["beta", "sub"]


@pytest.mark.parametrize("package", PACKAGES, ids=[p.relative_to(ROOT).as_posix() for p in PACKAGES])
def test_package_docstring_names_every_module(package):
    assert len(PACKAGES) >= 20  # runtime and export with their folders: fewer means the glob broke
    missing = unnamed(package)
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py: its docstring does not name {missing}"
