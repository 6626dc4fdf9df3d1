"""kztts.server.command: ``kztts serve``'s flags (``add_command``), checked into ``ServeOptions`` before anything
loads (``options_of``: the API key from the flag or ``$KZTTS_API_KEY``), and ``cmd_serve``: the serve extra
required, a warning for a public address without a key, the line that says where it listens (the command run
as a process: tests/server/test_serve.py)."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from kztts.core.errors import KzttsError
from kztts.server import command
from kztts.server.bodies import Limits
from kztts.server.service import ServeOptions


def parse(*argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("-q", "--quiet", action="store_true")
    command.add_command(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *map(str, argv)])


def test_the_flags_and_their_defaults(tmp_path):
    args = parse(tmp_path)
    assert args.func is command.cmd_serve
    assert (args.host, args.port, args.batch, args.queue, args.voices, args.api_key, args.model_name) == \
        ("127.0.0.1", 8000, 4, 16, None, None, None)
    assert (args.max_input, args.max_frames, args.max_tokens) == (Limits.max_input_chars, Limits.max_frames,
                                                                   Limits.max_tokens)
    assert args.context is args.target is args.placement is None


def test_options_of_the_flags(tmp_path, monkeypatch):
    monkeypatch.delenv(command.API_KEY_VARIABLE, raising=False)
    options = command.options_of(parse(tmp_path, "--host", "0.0.0.0", "--port", 0, "--voices", tmp_path, "--batch", 2,
                                       "--queue", 0, "--model-name", "m", "--max-input", 100, "--max-frames", 50,
                                       "--max-tokens", 20, "--context", 64, "--target", "simulator",
                                       "--placement", "all-htp"))
    assert options == ServeOptions(bundle=tmp_path, host="0.0.0.0", port=0, voices=tmp_path, batch=2, queue=0,
                                   api_key=None, target="simulator", placement="all-htp",
                                   limits=Limits(max_input_chars=100, max_frames=50, max_tokens=20), model_name="m",
                                   context=64)


def test_the_api_key_comes_from_the_flag_else_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(command.API_KEY_VARIABLE, "from-env")
    assert command.options_of(parse(tmp_path)).api_key == "from-env"
    assert command.options_of(parse(tmp_path, "--api-key", "from-flag")).api_key == "from-flag"
    monkeypatch.setenv(command.API_KEY_VARIABLE, "")
    assert command.options_of(parse(tmp_path)).api_key is None  # empty: no key


def test_bad_flags_are_refused_before_anything_loads(tmp_path):
    with pytest.raises(KzttsError, match="no such bundle folder"):
        command.options_of(parse(tmp_path / "none"))
    with pytest.raises(KzttsError, match="--batch must be an integer >= 1"):
        command.options_of(parse(tmp_path, "--batch", 0))
    with pytest.raises(KzttsError, match="--context must be an integer >= 16"):
        command.options_of(parse(tmp_path, "--context", 4))


def test_cmd_serve_needs_the_serve_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(command, "serve", None)  # what the import leaves when starlette or uvicorn is missing
    with pytest.raises(KzttsError, match=r"kztts serve needs the serve extra .* pip install -e '\.\[serve\]'"):
        command.cmd_serve(parse(tmp_path))


@pytest.fixture
def server_log_level():
    """``cmd_serve`` sets the server's log level (its access log is the command's output): restored after."""
    logger = logging.getLogger("kztts.server")
    level = logger.level
    yield
    logger.setLevel(level)


def test_cmd_serve_runs_the_server_and_says_where(tmp_path, monkeypatch, capsys, server_log_level):
    served = []

    def serve(options, on_ready):
        served.append(options)
        on_ready("http://0.0.0.0:8123")
        return 0

    monkeypatch.setattr(command, "serve", serve)
    monkeypatch.delenv(command.API_KEY_VARIABLE, raising=False)
    assert command.cmd_serve(parse(tmp_path, "--host", "0.0.0.0")) == 0
    out, err = capsys.readouterr()
    assert out == "kztts serve: listening on http://0.0.0.0:8123 (Ctrl-C or SIGTERM drains and exits)\n"
    assert err.startswith("kztts: serving on 0.0.0.0 without an API key: anyone who reaches this address may use it")
    assert served[0].host == "0.0.0.0" and logging.getLogger("kztts.server").level == logging.INFO
    assert command.cmd_serve(parse(tmp_path, "--api-key", "k", "--host", "0.0.0.0")) == 0
    assert capsys.readouterr().err == ""  # a key: no warning
    assert command.cmd_serve(parse(tmp_path)) == 0
    assert capsys.readouterr().err == ""  # this machine only: no warning


def test_serve_demo_names_the_embedded_demo_bundle(tmp_path, monkeypatch, capsys, server_log_level, equal_bundle):
    """``kztts serve demo``: the demo's bundle (a cached export whose path is a hash), unless a folder named demo is
    here (a real folder wins)."""
    from support import kztts_main

    served = []
    monkeypatch.setattr(command, "serve", lambda options, on_ready: served.append(options) or 0)
    monkeypatch.chdir(tmp_path)
    code, _, err = kztts_main(capsys, "serve", "demo")
    assert code == 0, err
    assert served[-1].bundle == equal_bundle  # the demo: the tiny "equal" model's cached export
    (tmp_path / "demo").mkdir()
    code, _, err = kztts_main(capsys, "serve", "demo")
    assert code == 0 and served[-1].bundle == Path("demo"), err
