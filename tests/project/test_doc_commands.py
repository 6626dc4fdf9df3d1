"""Every command the docs show still parses: each ``kztts ...`` and ``python benchmarks/...`` command in
README.md, docs/*.md and benchmarks/**/README.md (fenced blocks and inline code) goes through the real
argparse parser (``kztts.cli.main.build_parser``; a benchmark script's own parser, reached by running the
script up to its ``parse_args`` and stopping there). Placeholders (BUNDLE, MODEL_DIR, ...) parse as the
paths they stand for. A complete command must parse; an inline mention that leaves out a required value
(`kztts bench --lm`, `kztts inspect --target`) must still name a command and flags that exist."""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import runpy
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from support import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("**/README.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")
# where a command starts: a line's start (after a shell prompt), a comment, or a shell operator
START = re.compile(r"(?:^|(?<=#)|(?<=&&)|(?<=\|\|)|(?<=[;|]))\s*(?:\S*\$\s+)?((?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
                   r"(?:\S*/)?(?:kztts(?=\s|$)(?!\s+[\w-]+[:,])|python3?\s+(?:benchmarks/|-m\s+kztts)).*)$")
SHELL_END = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<", "#"}
# the least a published command set must hold: fewer means the extraction broke, not that the docs shrank
MIN_COMMANDS = 250


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    inline: bool
    text: str

    @property
    def synopsis(self) -> bool:
        """A usage line (``[--flag N]``, ``a|b``, ``...``, ``<name>``) rather than a command to run."""
        return bool(re.search(r"\[|\||\.\.\.|<[^>]*>", self.text))

    def argv(self) -> list[str]:
        """Tokens from the program on, usage brackets dropped, cut at the first shell operator."""
        text = self.text.replace("\\|", "|")
        if self.synopsis:  # brackets and alternatives go: every flag they name is checked
            text = re.sub(r"\s\|\s", " ", text.replace("[", " ").replace("]", " "))
        tokens = shlex.split(text, comments=True)
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
            tokens.pop(0)
        for i, token in enumerate(tokens):
            if token in SHELL_END or re.fullmatch(r"\d?>.*", token):
                return tokens[:i]
        return tokens


def commands() -> list[Command]:
    """Every documented command, in file order."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        name = doc.relative_to(ROOT).as_posix()
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start()) + 2
            joined, n = "", first
            for i, line in enumerate(block.group(1).splitlines()):  # join continued lines, keep numbers
                joined, n = (joined + " " + line.rstrip("\\"), n) if joined else (line.rstrip("\\"), first + i)
                if line.endswith("\\"):
                    continue
                found += [Command(f"{name}:{n}", False, m.strip()) for m in _starts(joined)]
                joined = ""
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        joined, n = "", 0
        for i, line in enumerate(prose.splitlines(), 1):  # indented code blocks (4 spaces or more)
            if not joined and not line.startswith("    "):
                continue
            joined, n = (joined + " " + line.strip().rstrip("\\"), n) if joined else (line.strip().rstrip("\\"), i)
            if not line.endswith("\\"):
                found += [Command(f"{name}:{n}", False, m.strip()) for m in _starts(joined)]
                joined = ""
        for span in INLINE.finditer(prose):
            line = prose.count("\n", 0, span.start()) + 1
            found += [Command(f"{name}:{line}", True, m.strip()) for m in _starts(span.group(1))]
    return found


def _starts(line: str) -> list[str]:
    out = []
    for part in re.split(r"(?<=\s)(?=&&|\|\||;)|(?=#)", line):
        m = START.search(part.lstrip("#&|; "))
        if m and not re.match(r"\S*/?kztts\s*=", m.group(1)):
            out.append(m.group(1))
    return out


class Refused(Exception):
    pass


class Parsed(Exception):
    """Raised once a script's parser accepted its arguments, so the script stops before doing any work."""


def _error(parser, message):
    raise Refused(f"{parser.prog}: {message}")


@contextlib.contextmanager
def _parsing():
    err = io.StringIO()
    with mock.patch.object(argparse.ArgumentParser, "error", _error), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            yield
        except SystemExit as exc:  # --help (0), or a parser with its own error method (2)
            if exc.code not in (0, None):
                lines = err.getvalue().strip().splitlines()
                raise Refused(lines[-1] if lines else f"exit {exc.code}") from None


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: action for action in parser._actions for s in action.option_strings}


def _command_parser(parser: argparse.ArgumentParser, args: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub)parser that reads ``args`` and the arguments it reads (its command name dropped)."""
    sub = _subparsers(parser)
    if sub and args and args[0] in sub:
        return _command_parser(sub[args[0]], args[1:])  # nested verbs: `kztts voice create ...`
    return parser, args


def _mention_problem(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """For a usage line or a mention: the unknown command or flag it names, or a literal value a flag refuses."""
    sub = _subparsers(parser)
    if sub and args and not args[0].startswith("-") and args[0] not in sub and not PLACEHOLDER.fullmatch(args[0]):
        return f"no command {args[0]!r}"
    parser, args = _command_parser(parser, args)
    options = _options(parser)
    for flag, value in zip(args, [*args[1:], ""]):
        if not flag.startswith("-") or flag in ("-", "--") or re.fullmatch(r"-\d.*", flag):
            continue
        action = options.get(flag.split("=")[0])
        if action is None:
            return f"unknown flag {flag!r}"
        values = [v for v in re.split(r"[|,]", value) if v] if action.choices and value[:1] not in "-[" else []
        refused = [v for v in values if not PLACEHOLDER.fullmatch(v) and v not in action.choices]
        if refused:
            return f"{flag} refuses {refused} (choices {list(action.choices)})"
    return None


# a placeholder for a value (BUNDLE, MODEL_DIR, N, <bundle>): stands for what the user types there
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_-]*|<[^>]+>")


def _stand_in(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """``args`` with each placeholder value of a typed or choice flag replaced by a value it accepts (a path
    placeholder parses as itself)."""
    options, out = _options(_command_parser(parser, args)[0]), list(args)
    for i in range(1, len(out)):
        action = options.get(out[i - 1])
        if action is not None and PLACEHOLDER.fullmatch(out[i]):
            if action.choices:
                out[i] = str(next(iter(action.choices)))
            elif action.type in (int, float):
                out[i] = "1"
    return out


def _kztts_parser() -> argparse.ArgumentParser:
    from kztts.cli.main import build_parser

    return build_parser()


@functools.lru_cache(maxsize=None)
def _script_parser(script: Path) -> argparse.ArgumentParser:
    """The parser ``script`` builds, caught at its ``parse_args`` (the script stops there, before any work)."""
    caught = []

    def catch(self, args=None, namespace=None):
        caught.append(self)
        raise Parsed

    # as `python script` runs it: its own folder first on the path (scripts import their siblings)
    with mock.patch.object(argparse.ArgumentParser, "parse_args", catch), \
            mock.patch.object(sys, "argv", [str(script)]), mock.patch.object(sys, "path", [str(script.parent), *sys.path]):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except Parsed:
            pass
    assert caught, f"{script} ran to its end without parsing its arguments"
    return caught[0]


def _script_argv_need(source: str) -> int | None:
    """How many arguments a script without argparse reads from sys.argv (None: it has a parser)."""
    if "parse_args" in source or "kztts.bench.lm import main" in source:
        return None
    return max((int(i) for i in re.findall(r"sys\.argv\[(\d+)", source)), default=0)


def check(command: Command, kztts_parser: argparse.ArgumentParser) -> str | None:
    """None if ``command`` parses; else why not."""
    argv = command.argv()
    if not argv:
        return "no command left after the shell words"
    program, args = argv[0], argv[1:]
    if program.endswith("kztts"):
        parse, parser = kztts_parser.parse_args, kztts_parser
    else:  # python benchmarks/... or python -m kztts[.cli]
        if args[:1] == ["-m"]:
            parse, parser, args = kztts_parser.parse_args, kztts_parser, args[2:]
        else:
            script, args = ROOT / args[0], args[1:]
            if "<" in script.as_posix():  # benchmarks/<study>/<script>.py: the pattern, not a script
                return None
            if not script.is_file():
                return f"no script {script.relative_to(ROOT)}"
            source = script.read_text(encoding="utf-8")
            need = _script_argv_need(source)
            if need is not None:
                return None if len(args) >= need else f"{script.name} reads {need} arguments, given {len(args)}"
            parser = _script_parser(script)
            parse = parser.parse_args
    if command.synopsis:
        return _mention_problem(parser, args)
    try:
        with _parsing():
            parse(_stand_in(parser, args))
    except Refused as exc:
        message = str(exc)
        left_out = "arguments are required" in message or "expected one argument" in message
        if command.inline and left_out:
            return _mention_problem(parser, args)
        return message
    return None


@pytest.fixture(scope="module")
def documented() -> list[Command]:
    return commands()


def test_the_extraction_finds_commands_and_only_commands():
    text = ("```bash\nKZTTS_X=1 .venv/bin/kztts synth \"Hi.\" -o a.wav \\\n  --bundle B  # a comment\n"
            "cd x && kztts inspect B --json > out.txt\nfrom kztts import TTS\nprose kztts bench\n"
            "tts = TTS(\"b\")  # kztts export DIR -o b\n```\nsee `kztts bench --quality` and `kztts`\n")
    with mock.patch.object(Path, "read_text", return_value=text), \
            mock.patch(__name__ + ".DOCS", [ROOT / "README.md"]):
        found = commands()
    assert [(c.where, c.inline, c.argv()) for c in found] == [
        ("README.md:2", False, [".venv/bin/kztts", "synth", "Hi.", "-o", "a.wav", "--bundle", "B"]),
        ("README.md:4", False, ["kztts", "inspect", "B", "--json"]),
        ("README.md:7", False, ["kztts", "export", "DIR", "-o", "b"]),
        ("README.md:9", True, ["kztts", "bench", "--quality"]), ("README.md:9", True, ["kztts"])]


def test_a_command_that_no_longer_parses_is_caught():
    parser = _kztts_parser()
    bad = [Command("x:1", False, "kztts bench --w8a16-bundle B"), Command("x:2", True, "kztts bench --w8a16-bundle"),
           Command("x:3", False, "kztts export"), Command("x:4", True, "kztts spell B"),
           Command("x:5", False, "python benchmarks/hybrid_lm/make_hybrid.py OUT --no-such-flag")]
    good = [Command("y:1", True, "kztts export"), Command("y:2", True, "kztts bench --lm"),
            Command("y:3", False, "kztts export DIR -o B"), Command("y:4", False, "kztts --help"),
            Command("y:5", False, "python benchmarks/hybrid_lm/make_hybrid.py OUT")]
    assert [c.where for c in bad if check(c, parser) is None] == []
    assert [(c.where, check(c, parser)) for c in good] == [(c.where, None) for c in good]


def test_every_documented_command_parses(documented):
    parser = _kztts_parser()
    failed = [f"{c.where}: {c.text}\n    -> {problem}" for c in documented if (problem := check(c, parser))]
    print(f"{len(documented)} documented commands checked "
          f"({sum(not c.inline for c in documented)} in code blocks, {sum(c.inline for c in documented)} inline)")
    assert not failed, f"{len(failed)} documented commands no longer parse:\n" + "\n".join(failed)
    assert len(documented) >= MIN_COMMANDS


def test_documented_curl_calls_fail_on_an_error_status():
    """A documented ``curl`` call has ``-f``: without it an error status writes the server's JSON error into the
    audio file (``-o hello.wav``) and exits 0."""
    bare = [f"{doc.relative_to(ROOT)}: {line.strip()}" for doc in DOCS
            for line in doc.read_text(encoding="utf-8").splitlines()
            if re.search(r"(^\s*|`)curl\s", line) and not re.search(r"curl\s+(-\w*f\w*\b|--fail\b)", line)]
    assert bare == []
