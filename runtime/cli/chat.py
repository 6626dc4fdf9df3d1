"""``kztts chat``: a conversation with an LM bundle (ChatML; the history stays in the KV cache)."""
from __future__ import annotations

import argparse
import sys

from kztts.cli.generate import add_lm_options, open_lm, print_stream

EXIT_WORDS = ("/exit", "/quit")


def cmd_chat(args: argparse.Namespace) -> int:
    lm, params = open_lm(args)
    session = lm.chat_session(system=args.system)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"kztts chat: {lm.bundle.path} ({lm.context} positions); {' or '.join(EXIT_WORDS)} or Ctrl-D ends",
              file=sys.stderr)
    turn = 0
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if line.strip() in EXIT_WORDS:
            break
        if not line.strip():
            continue
        print_stream(session.send(line, args.max_new_tokens, params=params, seed=args.seed + turn,
                                   greedy=args.greedy))
        turn += 1
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("chat", help="chat with an LM bundle (ChatML; the history stays in the KV cache)")
    add_lm_options(s)
    s.add_argument("--system", help="system prompt (default: the checkpoint's chat template's, if any)")
    s.set_defaults(func=cmd_chat)
