"""Where generated artifacts (tiny models, bundles, goldens) are cached."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$KZTTS_CACHE`` if set, else ``~/.cache/kztts``."""
    root = os.environ.get("KZTTS_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "kztts"
