"""The ``kztts`` command line: the parser of every command, and the run of one inside the error boundary."""
from __future__ import annotations

import argparse
import logging
import sys

from kztts.cli import bench, calibrate, chat, devices, export, fetch_lm, generate, inspect, make_tiny, synth, validate
from kztts.cli.boundary import run_command
from kztts.core import progress
from kztts.core.env import check_environment
from kztts.generation.settings import reference_settings, with_environment
from kztts.server import command as serve  # kztts.cli holds 15 modules, the most a folder may

# in the order ``kztts --help`` lists them
COMMANDS = (make_tiny, export, validate, synth, inspect, devices, calibrate, generate, chat, fetch_lm, bench, serve)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kztts", description="Qwen3-TTS on ONNX Runtime (CPU, Qualcomm QNN/HTP)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines or bars on stderr (errors and results are still printed)")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_command(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line, for reports that quote it
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    progress.configure(quiet=args.quiet)

    def command() -> int:
        check_environment()  # every KZTTS_* variable, before any work
        with_environment(reference_settings())  # and the sampling overrides (KZTTS_TEMP...)
        synth.name_demo(args)  # a TTS bundle named "demo": the embedded demo's
        return args.func(args)

    return run_command(command)


if __name__ == "__main__":
    sys.exit(main())
