"""Every ``*.md`` file a source, test, benchmark or doc cites exists in the repo: a comment that sends its
reader to a document nobody can open explains nothing. Documents are named in capitals (README.md,
docs/DESIGN.md); lowercase names (results.md) are reports a command writes. A name resolves from the repo root, the citing
file's folder or docs/ (``docs/QNN_EP.md``, ``QWEN3_TTS.md`` from a doc, ``../tts_grid/README.md``)."""
from __future__ import annotations

import re
from pathlib import Path

from support import ROOT

CITED = re.compile(r"(?<![\w./-])((?:\.\./|\./)*[\w-]+(?:/[\w.-]+)*\.md)\b")
# documents the repo names without holding: another tool's files
NOT_OURS = {"CHANGELOG.md"}
SOURCES = [p for base in ("runtime", "export", "tests", "benchmarks", "scripts") for p in (ROOT / base).rglob("*")
           if p.suffix in (".py", ".md", ".sh")] + [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]


def unresolved(path: Path, text: str) -> list[str]:
    """The ``*.md`` names in ``text`` (written in ``path``) that resolve to no file."""
    out = []
    for name in CITED.findall(text):
        if name in NOT_OURS or not re.fullmatch(r"[A-Z0-9_]+\.md", name.rsplit("/", 1)[-1]):
            continue  # a lowercase name is a report a command writes (results.md), not a document
        if not any((base / name).is_file() for base in (ROOT, path.parent, ROOT / "docs")):
            out.append(name)
    return out


def test_the_check_sees_a_missing_document():
    here = ROOT / "runtime" / "htp" / "qnn.py"
    text = ("(docs/QNN_EP.md) REFERENCE.md, see QNN.md and docs/DESIGN.md; ../README.md; https://x.y/z/NOTES.md "
            "writes results.md and OUT/quality/index.md; docs/GONE.md")
    assert unresolved(here, text) == ["REFERENCE.md", "QNN.md", "docs/GONE.md"]


def test_every_cited_document_exists():
    assert len(SOURCES) > 100
    missing = [f"{p.relative_to(ROOT)}: {name}" for p in SOURCES if p != Path(__file__)
               for name in unresolved(p, p.read_text(encoding="utf-8"))]
    assert not missing, "cited documents that are not in the repo:\n" + "\n".join(missing)
