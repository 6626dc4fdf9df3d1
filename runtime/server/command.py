"""``kztts serve BUNDLE``: an OpenAI-compatible speech (TTS bundle) or chat (LM bundle) server (docs/SERVE.md).

The command module of ``kztts serve`` (``add_command``, ``cmd_serve``), kept here beside the server it runs:
``kztts.cli`` holds the most modules a folder may."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from kztts.core.errors import KzttsError
from kztts.server.bodies import Limits

SERVE_EXTRA = ("starlette", "uvicorn", "prometheus_client", "anyio", "h11")
try:  # the serve extra: starlette, uvicorn, prometheus-client
    from kztts.server.run import serve
    from kztts.server.service import ServeOptions
except ImportError as exc:  # every other command runs without it
    if exc.name not in SERVE_EXTRA:
        raise
    serve = ServeOptions = None

API_KEY_VARIABLE = "KZTTS_API_KEY"


def options_of(args: argparse.Namespace) -> ServeOptions:
    """The flags checked into ``ServeOptions`` (before anything loads)."""
    if not Path(args.bundle).is_dir():
        raise KzttsError(f"{args.bundle}: no such bundle folder (kztts export ... -o BUNDLE makes one)")
    key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_VARIABLE) or None)
    limits = Limits(max_input_chars=args.max_input, max_frames=args.max_frames, max_tokens=args.max_tokens)
    return ServeOptions(bundle=Path(args.bundle), host=args.host, port=args.port,
                        voices=Path(args.voices) if args.voices else None, batch=args.batch, queue=args.queue,
                        api_key=key, target=args.target, placement=args.placement, limits=limits,
                        model_name=args.model_name, context=args.context,
                        tts=Path(args.tts) if args.tts else None).check()


def cmd_serve(args: argparse.Namespace) -> int:
    if serve is None:
        raise KzttsError("kztts serve needs the serve extra (starlette, uvicorn, prometheus-client): "
                         "pip install -e '.[serve]'")
    options = options_of(args)
    if not args.quiet:  # the access log and the start-up lines are this command's output
        logging.getLogger("kztts.server").setLevel(logging.INFO)
    if options.host not in ("127.0.0.1", "localhost", "::1") and options.api_key is None:
        print(f"kztts: serving on {options.host} without an API key: anyone who reaches this address may use it "
              f"(give --api-key or ${API_KEY_VARIABLE})", file=sys.stderr)

    def ready(url: str) -> None:
        print(f"kztts serve: listening on {url} (Ctrl-C or SIGTERM drains and exits)", flush=True)

    return serve(options, on_ready=ready)


def add_command(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible speech / chat server over a bundle (docs/SERVE.md)")
    s.add_argument("bundle", help="a TTS bundle (speech) or an LM bundle (chat); demo: the embedded demo's TTS "
                                  "bundle (tiny, random weights)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port, printed)")
    s.add_argument("--tts", metavar="TTS_BUNDLE", help="with an LM bundle: speak replies with this TTS bundle "
                                                       "(chat completions with modalities [\"text\", \"audio\"])")
    s.add_argument("--voices", help="Base bundles: folder of voices, NAME.wav recordings, NAME.npy x-vectors and "
                                    "NAME.voice saved voices (kztts voice create), named by stem; a CustomVoice "
                                    "bundle's voices are its preset speakers")
    s.add_argument("--batch", type=int, default=4, help="requests generated together (default 4)")
    s.add_argument("--queue", type=int, default=16,
                   help="requests that may wait for a free row (default 16); more are refused with 429")
    s.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' (default ${API_KEY_VARIABLE}, else none)")
    s.add_argument("--model-name", help="the model id clients send (default: the bundle folder's name)")
    s.add_argument("--max-input", type=int, default=Limits.max_input_chars,
                   help=f"characters of speech input per request (default {Limits.max_input_chars}; more: 413)")
    s.add_argument("--max-frames", type=int, default=Limits.max_frames,
                   help=f"highest max_frames a speech request may ask, per utterance (default {Limits.max_frames})")
    s.add_argument("--max-tokens", type=int, default=Limits.max_tokens,
                   help=f"highest max_tokens a chat request may ask, and its default (default {Limits.max_tokens})")
    s.add_argument("--context", type=int, help="Talker (LM) positions per request: a longer speech text is spoken "
                                                "in pieces, a longer conversation refused (default: 4096, at most the "
                                                "model's)")
    s.add_argument("--target", help="qnn_configs target: run the graphs its placement puts on the HTP there "
                                    "(then one request at a time: batching runs the fused CPU graphs)")
    s.add_argument("--placement", help="where the Talker's layers run (as for synth); needs --target for HTP parts")
    s.set_defaults(func=cmd_serve)
