"""Each command module of kztts.cli parses and checks its flags, then calls the layer that does the work
(docs/DESIGN.md, "The command line"): here each command function is called directly with the layer below it
stubbed, to see what it refuses before any work and what it hands on (the commands end to end: the other files of
tests/cli and the layers' own folders)."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from kztts.cli import bench as cli_bench
from kztts.cli import calibrate as cli_calibrate
from kztts.cli import chat as cli_chat
from kztts.cli import fetch_lm as cli_fetch_lm
from kztts.cli import generate as cli_generate
from kztts.cli import make_tiny as cli_make_tiny
from kztts.cli.main import build_parser
from kztts.core.errors import KzttsError


def parse(*argv):
    args = build_parser().parse_args([str(a) for a in argv])
    args.argv = [str(a) for a in argv]
    return args


def must_not_run(*args, **kwargs):
    raise AssertionError("the work started before the flags were checked")


# ---------------------------------------------------------------- kztts bench
def test_bench_runs_the_grid_with_its_options(monkeypatch):
    ran = []
    monkeypatch.setattr(cli_bench, "run_bench", lambda options: ran.append(options) or {"rows": [{"name": "a"}]})
    args = parse("bench", "--weights", "fp32,int8", "--frames", 6, "--no-reference")
    assert cli_bench.cmd_bench(args) == 0
    (options,) = ran
    assert (options.weights, options.frames, options.no_reference, options.threads) == ("fp32,int8", 6, True, "1,2")
    monkeypatch.setattr(cli_bench, "run_bench", lambda options: {"rows": [{"name": "a", "error": "boom"}]})
    assert cli_bench.cmd_bench(parse("bench")) == 1  # a row that failed: exit 1, the table still written


def test_bench_lm_rows_take_one_thread_count_and_one_target(monkeypatch, tmp_path):
    monkeypatch.setattr(cli_bench.bench_lm, "run", must_not_run)
    with pytest.raises(KzttsError, match="the LM rows run at one thread count"):
        cli_bench.cmd_bench(parse("bench", "--lm", tmp_path, "--threads", "1,2"))
    with pytest.raises(KzttsError, match="the LM rows take one HTP target"):
        cli_bench.cmd_bench(parse("bench", "--lm", tmp_path, "--target", "simulator,x-elite"))
    handed = []
    monkeypatch.setattr(cli_bench.bench_lm, "run", lambda bench: handed.append(bench) or [{"error": None}])
    out = tmp_path / "out"
    assert cli_bench.cmd_bench(parse("bench", "--lm", tmp_path, "--target", "cpu,simulator", "--out", out)) == 0
    (bench,) = handed
    assert (bench.source, bench.target, bench.threads, bench.out) == (tmp_path, "simulator", 2, out)
    assert bench.command.startswith("kztts bench --lm ")


# ---------------------------------------------------------------- kztts calibrate
def test_calibrate_checks_its_outputs_and_flags_before_it_measures(monkeypatch, tmp_path):
    monkeypatch.setattr(cli_calibrate, "calibrate", must_not_run)
    with pytest.raises(KzttsError, match="--plan needs the quantization sensitivity: drop --no-sqnr"):
        cli_calibrate.cmd_calibrate(parse("calibrate", tmp_path, "--plan", tmp_path / "plan.json", "--no-sqnr"))
    with pytest.raises(KzttsError, match="--frames=0: give at least 1 frame per prompt"):
        cli_calibrate.cmd_calibrate(parse("calibrate", tmp_path, "-o", tmp_path / "p.json", "--frames", 0))
    with pytest.raises(KzttsError, match="missing"):
        cli_calibrate.cmd_calibrate(parse("calibrate", tmp_path, "-o", tmp_path / "missing" / "p.json"))
    (tmp_path / "taken").mkdir()
    with pytest.raises(KzttsError, match="taken"):  # the plot's default name is a folder here
        cli_calibrate.cmd_calibrate(parse("calibrate", tmp_path, "-o", tmp_path / "p.json", "--plot",
                                          tmp_path / "taken"))
    assert list(tmp_path.glob("p*")) == []


# ---------------------------------------------------------------- kztts generate, kztts chat
def test_generate_opens_the_lm_with_its_sampling_flags(chat_bundle, monkeypatch, capsys):
    from kztts.lm.lm import LM

    monkeypatch.setenv("KZTTS_TOPK", "7")
    monkeypatch.setenv("KZTTS_TEMP", "0.3")
    args = parse("generate", chat_bundle, "Hello", "--temperature", "0.9", "--max-new-tokens", 5, "--explain")
    lm, params = cli_generate.open_lm(args)
    assert isinstance(lm, LM) and (params.temperature, params.top_k) == (0.9, 7)  # flag > environment > checkpoint
    assert "talker_decode" in capsys.readouterr().err  # --explain: the plan first
    with pytest.raises(KzttsError, match="--max-new-tokens must be >= 1, got 0"):
        cli_generate.open_lm(parse("generate", chat_bundle, "Hello", "--max-new-tokens", 0))
    args = parse("generate", chat_bundle, "Hello", "--max-new-tokens", 5, "--greedy", "--seed", 3)
    assert cli_generate.cmd_generate(args) == 0
    want = "".join(lm.generate("Hello", 5, params=lm.params, greedy=True, seed=3))
    assert capsys.readouterr().out == want + "\n"


def test_print_stream_writes_the_pieces_as_they_come(capsys):
    cli_generate.print_stream(iter(["Hel", "lo", " ", "你好"]))
    assert capsys.readouterr().out == "Hello 你好\n"


def test_chat_sends_each_line_as_a_turn_until_exit(monkeypatch, capsys):
    sent = []

    class Session:
        def send(self, line, max_new_tokens, *, params, seed, greedy):
            sent.append((line, max_new_tokens, seed, greedy))
            return iter([f"<{line}>"])

    class FakeLM:
        def chat_session(self, system):
            sent.append(("system", system))
            return Session()

    monkeypatch.setattr(cli_chat, "open_lm", lambda args: (FakeLM(), "params"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n\n  \nsecond\n/exit\nnever\n"))
    assert cli_chat.cmd_chat(parse("chat", "B", "--system", "Be brief.", "--seed", 5, "--max-new-tokens", 9)) == 0
    assert sent == [("system", "Be brief."), ("hello", 9, 5, False), ("second", 9, 6, False)]  # a seed per turn
    assert capsys.readouterr().out == "<hello>\n<second>\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("only\n"))  # Ctrl-D (the end of the input) ends it too
    sent.clear()
    assert cli_chat.cmd_chat(parse("chat", "B", "--greedy")) == 0
    assert sent == [("system", None), ("only", 256, 0, True)]


# ---------------------------------------------------------------- kztts fetch-lm, kztts make-tiny
def test_fetch_lm_prints_the_checkpoints_path(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli_fetch_lm, "fetch_checkpoint", must_not_run)
    with pytest.raises(KzttsError, match="--jobs 0: give at least 1"):
        cli_fetch_lm.cmd_fetch_lm(parse("fetch-lm", "--jobs", 0, "--dir", tmp_path))
    got = []
    monkeypatch.setattr(cli_fetch_lm, "fetch_checkpoint",
                        lambda folder, jobs: got.append((folder, jobs)) or folder / "model.gguf")
    assert cli_fetch_lm.cmd_fetch_lm(parse("fetch-lm", "--dir", tmp_path / "ckpt", "--jobs", 2)) == 0
    assert got == [(tmp_path / "ckpt", 2)]
    assert capsys.readouterr().out == f"{tmp_path / 'ckpt' / 'model.gguf'}\n"


def test_make_tiny_hands_its_flags_to_the_builder(monkeypatch, tmp_path, capsys):
    from kztts.export.tts import tiny_build

    built = []
    monkeypatch.setattr(tiny_build, "make_tiny", lambda out, **kw: built.append((out, kw)) or out)
    args = parse("make-tiny", tmp_path / "m", "--size", "narrow", "--variant", "equal", "--seed", 7,
                 "--massive-layer", 1)
    assert cli_make_tiny.cmd_make_tiny(args) == 0
    assert built == [(tmp_path / "m", {"size": "narrow", "variant": "equal", "seed": 7, "massive_layer": 1,
                                        "kind": "base"})]
    assert capsys.readouterr().out == f"{tmp_path / 'm'}\n"
    (tmp_path / "file").write_text("x")
    with pytest.raises(KzttsError, match="file"):
        cli_make_tiny.cmd_make_tiny(parse("make-tiny", tmp_path / "file" / "m"))
    assert len(built) == 1 and Path(tmp_path / "file").is_file()


# ---------------------------------------------------------------- every command's --help
def test_every_argument_of_every_command_has_a_help_line():
    """``kztts CMD --help`` describes each argument: none is listed bare (make-tiny's out_dir and --seed, synth's text,
    validate's and inspect's bundle once were)."""
    import argparse

    bare = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            elif not isinstance(action, argparse._HelpAction) and not (action.help or "").strip():
                bare.append(" ".join([*path, *(action.option_strings[:1] or [action.dest])]))

    walk(build_parser(), ["kztts"])
    assert bare == []
