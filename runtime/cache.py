"""Where generated artifacts (tiny models, bundles, goldens) are cached."""
from __future__ import annotations

from pathlib import Path

from kztts import env


def cache_dir() -> Path:
    """``$KZTTS_CACHE`` if set, else ``~/.cache/kztts``."""
    return env.path("KZTTS_CACHE") or Path.home() / ".cache" / "kztts"
