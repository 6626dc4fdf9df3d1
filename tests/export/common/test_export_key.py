"""kztts.export.common.export_key: a cached bundle's code key covers the export code that shapes it, the shared
folders and its exporter's own, not the other exporter's nor the modules that only derive from a bundle
(docs/DESIGN.md: an LM bundle's key ignores export/tts, a TTS bundle's export/lm)."""
from __future__ import annotations

from pathlib import Path

from kztts.export.common import export_key
from kztts.export.common.export_key import DERIVED_ONLY, SHARED_FOLDERS, exporter_code_key

from support import ROOT


def keyed_files(monkeypatch, exporter: str) -> list[Path]:
    seen = []
    monkeypatch.setattr(export_key, "code_key", lambda *parts: seen.extend(parts) or "key")
    exporter_code_key(exporter)
    monkeypatch.undo()
    return [Path(p).resolve() for p in seen if isinstance(p, Path)]


def test_each_exporter_is_keyed_by_the_shared_folders_and_its_own(monkeypatch):
    export = ROOT / "export"
    for exporter, other in (("tts", "lm"), ("lm", "tts")):
        files = keyed_files(monkeypatch, exporter)
        folders = {f.parent.name for f in files}
        assert folders == {*SHARED_FOLDERS, exporter}, folders
        want = {f.resolve() for folder in (*SHARED_FOLDERS, exporter) for f in (export / folder).glob("*.py")
                if f.name not in DERIVED_ONLY}
        assert set(files) == want and not any(f.parent.name == other for f in files)
        assert not {f.name for f in files} & DERIVED_ONLY  # variants and the bench reference derive from a bundle


def test_the_keys_differ_by_exporter_and_are_stable():
    tts, lm = exporter_code_key("tts"), exporter_code_key("lm")
    assert tts != lm and tts == exporter_code_key("tts") and isinstance(tts, str) and len(tts) >= 8
