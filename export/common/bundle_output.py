"""Where an export writes its bundle: the output folder checked (``kztts.core.build_cache.check_output``), then
locked and staged (``bundle_output``: the opening the TTS, LM and hybrid LM exports share), and the files a bundle
derived from another shares with it (``link_tree``: precision variants, HTP bench bundles)."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

from kztts.core.build_cache import check_output, exclusive_output, staged_dir

log = logging.getLogger(__name__)


@contextlib.contextmanager
def bundle_output(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """The staging folder of ``out_dir``, moved into place when the block ends (``build_cache.staged_dir``), under
    ``out_dir``'s lock (``build_cache.exclusive_output``: a second export of ``out_dir`` fails at once). ``out_dir``
    is checked again under the lock: another export may have finished while this one took it (callers check it
    before their long work too, ``check_output``)."""
    with exclusive_output(out_dir), staged_dir(out_dir) as work:
        check_output(out_dir, overwrite)
        yield work


def link_tree(src: Path, dst: Path, skip: set[str], *, across_fs: str = "copy") -> None:
    """Hard-link every file of bundle ``src`` into ``dst`` except its manifest and ``skip``
    (paths relative to ``src``). Where a hard link fails (across file systems, or a file system
    without them) a file is copied (``across_fs="copy"``) or symbolically linked (``"symlink"``:
    avoids copying a base's gigabytes); where a symlink fails too (Windows without the
    privilege to create one), it is copied."""
    copied = 0
    for f in Path(src).rglob("*"):
        rel = f.relative_to(src).as_posix()
        if f.is_dir() or rel in skip or rel == "kztts.json":
            continue
        target = Path(dst) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f, target)
            continue
        except OSError:
            pass
        if across_fs == "symlink":
            try:
                target.symlink_to(f.resolve())
                continue
            except OSError:
                copied += 1
        shutil.copy2(f, target)
    if copied:
        log.warning("%s: %d file(s) of %s copied: neither a hard link nor a symbolic link could be made",
                    dst, copied, src)
