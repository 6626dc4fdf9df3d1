"""The code key of an exporter: a cached bundle (tests, demos, benchmarks) is rebuilt when the code that
shapes it changes."""
from __future__ import annotations

from pathlib import Path

from kztts.bundle import manifest, table_views
from kztts.core.build_cache import code_key

SHARED_FOLDERS = ("common", "graphs", "htp")  # the folders of kztts.export every exporter stands on
# Modules that derive from an exported bundle (precision variants carry their own code key) or run the reference for
# benchmarks: editing them must not re-export every cached bundle.
DERIVED_ONLY = frozenset({"variants.py", "bench_reference.py"})


def exporter_code_key(exporter: str) -> str:
    """Code key of the export code that shapes a bundle of ``exporter`` (its folder of ``kztts.export``: "tts" or
    "lm"): the shared folders and its own, but for the modules that only derive from a bundle."""
    export = Path(__file__).resolve().parents[1]
    files = [f for folder in (*SHARED_FOLDERS, exporter) for f in sorted((export / folder).glob("*.py"))
             if f.name not in DERIVED_ONLY]
    return code_key(*files, manifest, table_views)  # table_views: which tables become views
