"""The wheel: built from a copy of the sources (``pip wheel``), it holds every module and data file of
``kztts`` and ``kztts.export``, the shipped targets and the ``kztts`` command, and nothing else;
unpacked alone on ``sys.path`` it finds its targets and data inside itself.

``scripts/check_wheel.sh`` (run once by CI) installs it into a fresh venv and runs the CLI.
"""
from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import ROOT

# what the build reads; copied so a stale build/ or egg-info in the work tree cannot leak into the wheel
BUILD_INPUTS = ("setup.cfg", "pyproject.toml", "README.md", "runtime", "export", "qnn_configs")
# source folder -> where its files land in the wheel
LAYOUT = {"runtime": "kztts", "export": "kztts/export", "qnn_configs": "kztts/qnn_configs"}


def _package_files(folder: str) -> set[str]:
    """Wheel paths of the files of a source folder that must ship (all but caches and notes)."""
    src = ROOT / folder
    out = set()
    for f in src.rglob("*"):
        if f.is_dir() or "__pycache__" in f.parts or f.suffix in (".pyc", ".md"):
            continue
        out.add(f"{LAYOUT[folder]}/{f.relative_to(src).as_posix()}")
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this venv")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                          "--no-index", "-q", "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    wheels = list((tmp / "dist").glob("kztts-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set().union(*(_package_files(d) for d in LAYOUT))
    assert {"kztts/__init__.py", "kztts/export/__init__.py", "kztts/bench/__init__.py",
            "kztts/data/calibration_prompts.json", "kztts/qnn_configs/x_elite.json"} <= expected
    assert not expected - names, sorted(expected - names)
    info = next(iter({n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD")}))
    # nothing else: no top-level `export`/`runtime`/`tests` package, no stray files
    assert not {n for n in names if not n.startswith(info + "/")} - expected, \
        sorted({n for n in names if not n.startswith(info + "/")} - expected)


def test_wheel_metadata_has_the_command_and_the_requirements(wheel):
    z = zipfile.ZipFile(wheel)
    info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/RECORD"))
    entry = configparser.ConfigParser()
    entry.read_string(z.read(f"{info}/entry_points.txt").decode())
    assert dict(entry["console_scripts"]) == {"kztts": "kztts.cli.main:main"}
    assert z.read(f"{info}/top_level.txt").decode().split() == ["kztts"]
    meta = z.read(f"{info}/METADATA").decode()
    requires = {m.group(1) for m in re.finditer(r"^Requires-Dist: ([\w.-]+)[^;\n]*$", meta, re.M)}  # not extras
    assert {"numpy", "onnxruntime", "tokenizers", "soundfile", "tqdm", "filelock", "psutil"} <= requires


def test_unpacked_wheel_finds_its_targets_and_data(wheel, tmp_path):
    """With only the unpacked wheel providing kztts (no source tree), targets and prompts are found in it."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import json, kztts, kztts.htp.targets as t, kztts.eval.calibrate as c\n"
            "print(json.dumps([kztts.__file__, str(t.configs_dir()), t.list_targets(), "
            "str(t.load_target('x_elite').path), len(c.load_prompts())]))\n")
    env = {k: v for k, v in os.environ.items() if k != "KZTTS_QNN_CONFIGS"}
    env["PYTHONPATH"] = str(site)  # ahead of the editable install's finder
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    init, configs, targets, x_elite, prompts = json.loads(run.stdout)
    assert Path(init).is_relative_to(site) and Path(configs).is_relative_to(site), (init, configs)
    assert targets == sorted(p.stem for p in (ROOT / "qnn_configs").glob("*.json"))
    assert Path(x_elite).is_relative_to(site) and prompts > 0
