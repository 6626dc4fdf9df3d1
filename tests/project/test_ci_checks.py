"""CI cannot pass by skipping: under ``--ci-checks`` (or CI=true) tests/conftest.py fails a run on a skip that the
expected-skip list does not name, and ``--min-passed`` fails a run with fewer passes. Each check runs the real
tests/conftest.py in a child pytest on a tiny test file, as .ci/run runs the suite (two xdist workers included)."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT

TINY = '''
import pytest

def test_passes():
    pass

def test_passes_too():
    pass

def test_may_skip():
    pytest.skip("the capability it needs is missing")

@pytest.mark.parametrize("p", [1, 2])
def test_param_skips(p):
    pytest.skip("not here")
'''
OTHER = '''
import pytest
pytest.importorskip("a_module_no_host_has")

def test_never_collected():
    pass
'''
LISTED = """# comment
test_tiny.py::test_may_skip  # the tiny file's own reason
test_tiny.py::test_param_skips  # covers both parameters
"""


@pytest.fixture
def project(tmp_path):
    """A folder with the real conftest, a tiny test file and a list naming its skips."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_tiny.py").write_text(TINY)
    (tmp_path / "skips.txt").write_text(LISTED)
    return tmp_path


def run(folder: Path, *args: str, ci: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("PYTEST")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # xdist alone is loaded: the others only add start-up time
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist", "-p", "no:cacheprovider", "-q",
                           "--rootdir", str(folder),
                           "--expected-skips", str(folder / "skips.txt"), *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


def test_listed_skips_pass_and_an_unlisted_one_fails_under_ci_checks(project):
    (project / "test_other.py").write_text(OTHER)  # a whole module skipped at import, not listed
    bad = run(project, "--ci-checks", "-n", "2")  # as CI runs it: the workers' reports reach the controller
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "expected skips: 3 (of 2 entries in" in bad.stdout
    assert "test_tiny.py::test_param_skips[1]: covers both parameters" in bad.stdout
    assert "passed: 2 (floor 0)" in bad.stdout
    assert "CI checks FAILED" in bad.stdout and "1 skip(s) not in" in bad.stdout
    assert "test_other.py: could not import 'a_module_no_host_has'" in bad.stdout

    (project / "skips.txt").write_text(LISTED + "test_other.py  # the module's import\n")
    good = run(project, "--ci-checks", "-n", "0")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "expected skips: 4 (of 3 entries in" in good.stdout and "CI checks passed" in good.stdout


def test_ci_true_in_the_environment_checks_skips_and_without_ci_a_skip_passes(project):
    (project / "skips.txt").write_text("test_tiny.py::test_param_skips  # covers both parameters\n")
    strict = run(project, "-n", "0", ci="true")
    assert strict.returncode == 1 and "test_tiny.py::test_may_skip: the capability it needs is missing" in strict.stdout
    relaxed = run(project, "-n", "0")
    assert relaxed.returncode == 0 and "CI checks" not in relaxed.stdout, relaxed.stdout


def test_the_floor_fails_a_run_with_fewer_passes(project):
    met = run(project, "-n", "0", "--min-passed", "2")
    assert met.returncode == 0 and "passed: 2 (floor 2)" in met.stdout, met.stdout
    short = run(project, "-n", "0", "--min-passed", "3")
    assert short.returncode == 1, short.stdout
    assert "2 tests passed, fewer than the floor of 3" in short.stdout


def test_a_malformed_list_is_a_usage_error(project):
    (project / "skips.txt").write_text("test_tiny.py::test_may_skip\n")  # no reason
    bad = run(project, "-n", "0", "--ci-checks")
    assert bad.returncode != 0 and "skips.txt:1: expected 'NODE_ID  # the reason" in bad.stderr + bad.stdout


def test_every_expected_skip_names_a_test_that_can_skip():
    """Each entry of tests/expected_skips.txt is a test function that exists and calls a skip."""
    import conftest

    entries = conftest.read_expected_skips(ROOT / "tests" / "expected_skips.txt")
    assert entries
    for node, reason in entries.items():
        path, _, name = node.partition("::")
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        funcs = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == name.split("[")[0]]
        assert funcs, f"tests/expected_skips.txt: {node} is not a test"
        assert "skip" in ast.unparse(funcs[0]) and len(reason) > 40, node


@pytest.mark.parametrize("ci, code, word", [("true", 1, "FAILED"), ("", 0, "SKIPPED")])
def test_the_real_lm_check_fails_on_a_small_disk_under_ci(tmp_path, ci, code, word):
    """scripts/check_real_lm.sh on a host short of disk (a need no disk meets): a skip by hand, a failure under CI,
    before anything is fetched."""
    env = {**os.environ, "CI": ci, "KZTTS_REAL_LM_DISK_GB": "1000000", "KZTTS_CACHE": str(tmp_path / "cache"),
           "TMPDIR": str(tmp_path)}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "check_real_lm.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == code and done.stdout.startswith(f"{word}: the real checkpoint's check needs"), done
