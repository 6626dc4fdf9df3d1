"""``kztts chat``: a conversation with an LM bundle (ChatML; the history stays in the KV cache); with
``--speak TTS_BUNDLE`` each reply is spoken while it is written (``kztts.assistant``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kztts.assistant.player import open_player
from kztts.assistant.spoken_chat import SpokenChat
from kztts.assistant.spoken_reply import SpeakSettings
from kztts.cli.generate import add_lm_options, open_lm, print_stream
from kztts.core.atomic import check_writable_dir
from kztts.core.audio import read_voice, write_wav
from kztts.core.errors import KzttsError
from kztts.tts.tts import TTS

EXIT_WORDS = ("/exit", "/quit")


def check_speak_args(args: argparse.Namespace) -> None:
    """The --speak flags, checked before anything loads."""
    speak_only = [f for f, v in (("--speaker-wav", args.speaker_wav), ("--xvector", args.xvector),
                                 ("--speak-out", args.speak_out), ("--language", args.language)) if v]
    if not args.speak and speak_only:
        raise KzttsError(f"{speak_only[0]} needs --speak TTS_BUNDLE (the bundle that speaks the replies)")
    if not args.speak:
        return
    if not Path(args.speak).is_dir():
        raise KzttsError(f"--speak {args.speak}: no such bundle directory; give a TTS bundle (kztts export)")
    if args.speak_out:
        check_writable_dir(args.speak_out, "--speak-out")


def open_speaker(args: argparse.Namespace, lm, system: str | None) -> SpokenChat:
    recording = read_voice(args.speaker_wav) if args.speaker_wav else None
    tts = TTS(args.speak)
    # no voice flag: the bundle's default, as on every route (TTS.default_voice)
    voice = (tts.voice_from_xvector(args.xvector) if args.xvector else tts.voice_from_wav(*recording) if recording
             is not None else tts.default_voice())
    chat = SpokenChat(lm, tts, SpeakSettings(voice, language=args.language, seed=args.seed), system=system)
    took = chat.warm_up()
    print(f"kztts chat: replies spoken by {args.speak} (both models warmed up in {took * 1000:.0f} ms)", file=sys.stderr)
    return chat


def spoken_turn(chat: SpokenChat, line: str, args: argparse.Namespace, params, turn: int, player) -> None:
    for kind, value in chat.send(line, args.max_new_tokens, params=params, seed=args.seed + turn,
                                 greedy=args.greedy):
        if kind == "text":
            sys.stdout.write(value)
            sys.stdout.flush()
        elif player is not None:
            player.play(value)
    done = chat.turns[-1]
    p = done.playback
    sys.stdout.write("\n")
    where = ""
    if args.speak_out:
        out = Path(args.speak_out) / f"reply-{turn + 1:02d}.wav"
        write_wav(out, done.audio, done.sample_rate)
        where = f" -> {out}"
    first = "no audio" if p.first_audio is None else f"first audio {p.first_audio * 1000:.0f} ms after your message"
    print(f"[spoken: {p.audio:.2f} s, {first}, stalled {p.stall * 1000:.0f} ms in {p.stalls} waits "
          f"({p.stall_share:.0%} of the listening){where}]", file=sys.stderr)


def cmd_chat(args: argparse.Namespace) -> int:
    check_speak_args(args)
    lm, params = open_lm(args)
    chat = open_speaker(args, lm, args.system) if args.speak else None
    if args.speak_out:
        Path(args.speak_out).mkdir(parents=True, exist_ok=True)
    session = chat.session if chat is not None else lm.chat_session(system=args.system)
    player = None
    if chat is not None:
        player, how = open_player(chat.tts.sample_rate)
        print(f"kztts chat: audio {how}", file=sys.stderr)
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"kztts chat: {lm.bundle.path} ({lm.context} positions); {' or '.join(EXIT_WORDS)} or Ctrl-D ends",
              file=sys.stderr)
    turn = 0
    try:
        while True:
            try:
                line = input("> " if interactive else "")
            except EOFError:
                break
            if line.strip() in EXIT_WORDS:
                break
            if not line.strip():
                continue
            if chat is not None:
                spoken_turn(chat, line, args, params, turn, player)
            else:
                print_stream(session.send(line, args.max_new_tokens, params=params, seed=args.seed + turn,
                                          greedy=args.greedy))
            turn += 1
    finally:
        if player is not None:
            player.close()
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("chat", help="chat with an LM bundle (ChatML; the history stays in the KV cache); "
                                    "--speak TTS_BUNDLE speaks each reply while it is written")
    add_lm_options(s)
    s.add_argument("--system", help="system prompt (default: the checkpoint's chat template's, if any)")
    s.add_argument("--speak", metavar="TTS_BUNDLE", help="speak each reply with this TTS bundle while the LM writes it "
                                                        "(demo: the embedded demo's bundle)")
    voice = s.add_mutually_exclusive_group()
    voice.add_argument("--speaker-wav", help="with --speak: a recording of the voice (x-vector; default: the bundle's "
                                             "default voice, docs/USAGE.md \"Voices\")")
    voice.add_argument("--xvector", help="with --speak: an x-vector file (.npy, or raw little-endian float32)")
    s.add_argument("--language", help="with --speak: the replies' language (default auto)")
    s.add_argument("--speak-out", metavar="DIR", help="with --speak: write each reply's audio to DIR/reply-NN.wav")
    s.set_defaults(func=cmd_chat)
