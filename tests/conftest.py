"""Shared fixtures: tiny reference checkpoints and their bundles, built once and cached.

Models and bundles live under ``$KZTTS_CACHE`` (default ~/.cache/kztts), keyed by
the code that builds them, so a code change rebuilds them and reruns reuse them.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tiny models run fastest on one thread, and the test machine may be shared: more
# threads only add synchronisation (2 torch threads were 6x slower under load).
os.environ.setdefault("KZTTS_THREADS", "1")


def pytest_configure(config):
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)

VARIANTS = ("proj", "equal")
SMALL_CONTEXT, SMALL_CHUNK = 64, 16  # static shapes of the test-sized simulator target


@pytest.fixture(scope="session", params=VARIANTS)
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_model_dir(variant):
    from kztts.export.tts.tiny import cached_tiny

    return cached_tiny(variant)


@pytest.fixture(scope="session")
def tiny_bundle_dir(tiny_model_dir):
    from kztts.export.tts.bundle_writer import cached_bundle

    return cached_bundle(tiny_model_dir)


@pytest.fixture(scope="session")
def proj_bundle(tiny_dir):
    """The tiny "proj" checkpoint's CPU bundle (not parametrized)."""
    from kztts.export.tts.bundle_writer import cached_bundle

    return cached_bundle(tiny_dir)


@pytest.fixture(scope="session")
def equal_bundle():
    """The tiny "equal" checkpoint's CPU bundle (not parametrized; the demo's model, fp32 weights)."""
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny("equal"))


@pytest.fixture(scope="module")
def plain_bundle(equal_bundle):
    """``equal_bundle`` opened without loading its graphs: what plan and registry checks read."""
    from kztts.bundle.bundle import Bundle

    return Bundle.open(equal_bundle, load_graphs=False)


@pytest.fixture(scope="session")
def eos_bundle():
    """The tiny "proj" checkpoint with the EOS bias (greedy speech ends by EOS after a few frames), its CPU
    bundle (cached)."""
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny

    return cached_bundle(cached_tiny("proj", eos_bias=True))


@pytest.fixture(scope="session")
def reference(tiny_model_dir):
    """The official qwen-tts wrapper on the tiny checkpoint (fp32, eager)."""
    from kztts.export.common.checkpoint import load_reference

    return load_reference(tiny_model_dir)


@pytest.fixture(scope="session")
def small_target(tmp_path_factory):
    """The simulator target with test-sized static shapes (context 64, prefill chunk 16)."""
    import json

    from kztts.htp.targets import configs_dir

    data = json.loads((configs_dir() / "simulator.json").read_text())
    data["shapes"].update(prefill_chunk=SMALL_CHUNK, context=SMALL_CONTEXT, decoder_chunk=5)  # divides the decoder segments (300, 275)
    data["placement"]["decoder"] = "htp"  # the shipped targets keep it on the CPU (fp16 SNR, see htp_export)
    data["talker_graphs"] = "prefill+decode"  # simulator.json ships prefill-only; the tests check both graphs
    p = tmp_path_factory.mktemp("targets") / "simulator_small.json"
    p.write_text(json.dumps(data, indent=1))
    return p


@pytest.fixture(scope="session")
def decoder_target(small_target, tmp_path_factory):
    """``small_target`` with only the speech decoder on the HTP: an export writes ``decoder_chunk`` alone as an HTP
    graph, and the Talker and the Code Predictor run on the CPU (the simulator's cost is the decoder's alone)."""
    import json

    data = json.loads(small_target.read_text())
    data["placement"].update(talker_prefill="cpu", talker_decode="cpu", cp_frame="cpu", decoder="htp")
    p = tmp_path_factory.mktemp("targets") / "simulator_small_decoder.json"
    p.write_text(json.dumps(data, indent=1))
    return p


@pytest.fixture(scope="session")
def prefill_only_target(small_target, tmp_path_factory):
    """``small_target`` with one Talker graph, as the shipped simulator target: decode steps run the
    padded prefill graph (``kztts.runners.talker_prefill_only``)."""
    import json

    data = json.loads(small_target.read_text())
    data["talker_graphs"] = "prefill-only"
    p = tmp_path_factory.mktemp("targets") / "simulator_small_prefill_only.json"
    p.write_text(json.dumps(data, indent=1))
    return p


@pytest.fixture(scope="session")
def tiny_dir():
    """The tiny "proj" checkpoint (not parametrized): the HTP tests' model."""
    from kztts.export.tts.tiny import cached_tiny

    return cached_tiny("proj")


@pytest.fixture(scope="session")
def htp_bundle(tiny_dir, small_target):
    """``tiny_dir`` exported with the static graphs of ``small_target`` (cached)."""
    from kztts.export.tts.bundle_writer import cached_target_bundle

    return cached_target_bundle(tiny_dir, small_target)


@pytest.fixture(scope="session")
def sequences(htp_bundle):
    """Teacher-forcing inputs of ``htp_bundle``: two real text prompts + 14 decode steps each."""
    from kztts.export.validate.htp import bundle_sequences

    return bundle_sequences(htp_bundle, frames=14)


@pytest.fixture(scope="session")
def qwen3_dir():
    """The tiny random Qwen3 causal LM (a Hugging Face directory, cached)."""
    from kztts.export.lm.tiny import cached_tiny_lm

    return cached_tiny_lm("qwen3")


@pytest.fixture(scope="session")
def chat_bundle(qwen3_dir):
    """``qwen3_dir``'s CPU bundle (its fused graphs and ``talker_batched``): what ``kztts serve`` chats with."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle

    return cached_lm_bundle(qwen3_dir)


@pytest.fixture(scope="session")
def qwen3_bundle(qwen3_dir, small_target):
    """``qwen3_dir`` exported with the CPU graphs, the static HTP graphs and the layer segments of
    ``small_target`` (cached): the LM tests' bundle."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle

    return cached_lm_bundle(qwen3_dir, target=str(small_target), segments=True)


@pytest.fixture(scope="session")
def voice_wav(tmp_path_factory):
    """The synthetic reference voice (``kztts.core.audio.synthetic_voice``) as a float WAV file, so the CLI and
    qwen-tts see the same samples."""
    from kztts.core.audio import synthetic_voice, write_wav

    path = tmp_path_factory.mktemp("voice") / "voice.wav"
    write_wav(path, synthetic_voice(), 24000, subtype="FLOAT")
    return path


# The other official kinds (kztts.tts.model_kind): CustomVoice in the 1.7B layout (projection Talker -> Code
# Predictor, the instruction taken) and the 0.6B layout (no projection, the instruction dropped), VoiceDesign.
KIND_MODELS = {"custom_voice": ("proj", "custom_voice"), "custom_voice_06": ("equal", "custom_voice"),
               "voice_design": ("proj", "voice_design")}


@pytest.fixture(scope="session")
def kind_dirs():
    """{name: checkpoint} of ``KIND_MODELS`` (built once, cached), looked up lazily."""
    from kztts.export.tts.tiny import cached_tiny

    class Dirs(dict):
        def __missing__(self, name):
            variant, kind = KIND_MODELS[name]
            self[name] = cached_tiny(variant, kind=kind)
            return self[name]

    return Dirs()


@pytest.fixture(scope="session")
def custom_voice_bundle(kind_dirs):
    """The tiny CustomVoice checkpoint in the 1.7B layout, its CPU bundle (cached)."""
    from kztts.export.tts.bundle_writer import cached_bundle

    return cached_bundle(kind_dirs["custom_voice"])


@pytest.fixture(scope="session")
def custom_voice_06_bundle(kind_dirs):
    """The tiny CustomVoice checkpoint in the 0.6B layout (takes no instruction), its CPU bundle (cached)."""
    from kztts.export.tts.bundle_writer import cached_bundle

    return cached_bundle(kind_dirs["custom_voice_06"])


@pytest.fixture(scope="session")
def voice_design_bundle(kind_dirs):
    """The tiny VoiceDesign checkpoint (1.7B layout), its CPU bundle (cached)."""
    from kztts.export.tts.bundle_writer import cached_bundle

    return cached_bundle(kind_dirs["voice_design"])


# ---------------------------------------------------------------- CI checks: no pass by skipping, a floor of passes
# Under CI (`--ci-checks`, which .ci/run passes, or CI=true in the environment) a skip that tests/expected_skips.txt
# does not list fails the run, and `--min-passed N` fails a run that passed fewer than N tests: a missing browser,
# espeak-ng, QNN EP or fetched model would otherwise turn a stage green having run nothing.
EXPECTED_SKIPS = Path(__file__).with_name("expected_skips.txt")


def pytest_addoption(parser):
    group = parser.getgroup("kztts CI checks")
    group.addoption("--ci-checks", action="store_true",
                    help="fail the run on any skip not listed in --expected-skips (also on when $CI is true)")
    group.addoption("--expected-skips", default=str(EXPECTED_SKIPS),
                    help="the skips allowed under --ci-checks: lines 'NODE_ID  # reason' (default: %(default)s)")
    group.addoption("--min-passed", type=int, default=0, help="fail the run when fewer tests pass than this")


def read_expected_skips(path: str | Path) -> dict[str, str]:
    """{node id: reason} of an expected-skip file: one ``NODE_ID  # reason`` a line, ``#`` lines are comments.
    An entry without ``[params]`` covers every parameter of its test; a file's path covers a whole-module skip."""
    entries = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        node, _, reason = line.partition("#")
        if not node.strip() or not reason.strip():
            raise pytest.UsageError(f"{path}:{number}: expected 'NODE_ID  # the reason it may skip on CI's host'")
        entries[node.strip()] = reason.strip()
    return entries


class CIChecks:
    """The controller's reports (xdist forwards the workers' to it), judged at the end of the session."""

    def __init__(self, config):
        self.strict = config.getoption("ci_checks") or os.environ.get("CI", "").lower() in ("true", "1")
        self.min_passed = config.getoption("min_passed")
        self.path = config.getoption("expected_skips")
        self.expected = read_expected_skips(self.path) if self.strict else {}
        self.passed = 0
        self.skips: dict[str, str] = {}  # node id -> the reason the skip gave
        self.problems: list[str] = []

    def allowed(self, nodeid: str) -> str | None:
        return self.expected.get(nodeid) or self.expected.get(nodeid.split("[", 1)[0])

    def skipped(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is reported as skipped, it is not one
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.skips[report.nodeid] = reason.removeprefix("Skipped: ")

    def judge(self) -> list[str]:
        problems = []
        if self.strict:
            unexpected = sorted(n for n in self.skips if self.allowed(n) is None)
            if unexpected:
                problems.append(f"{len(unexpected)} skip(s) not in {self.path}: a capability CI's host must have "
                                "is missing (install it), or list the test there with the reason it may skip:")
                problems += [f"  {n}: {self.skips[n]}" for n in unexpected]
        if self.passed < self.min_passed:
            problems.append(f"{self.passed} tests passed, fewer than the floor of {self.min_passed} (--min-passed): "
                            "tests were lost (collection, deselection) or stopped running")
        return problems


_CHECKS: CIChecks | None = None  # this session's, on the controller (or the one process of -n 0) only


def pytest_sessionstart(session):
    global _CHECKS
    config = session.config
    _CHECKS = None
    if not hasattr(config, "workerinput"):
        checks = CIChecks(config)
        if checks.strict or checks.min_passed:
            _CHECKS = checks


def pytest_runtest_logreport(report):
    if _CHECKS is not None:
        _CHECKS.skipped(report)
        if report.when == "call" and report.passed:
            _CHECKS.passed += 1


def pytest_collectreport(report):
    if _CHECKS is not None:  # a module skipped as a whole (pytest.importorskip, allow_module_level)
        _CHECKS.skipped(report)


def pytest_sessionfinish(session, exitstatus):
    if _CHECKS is not None:
        _CHECKS.problems = _CHECKS.judge()
        if _CHECKS.problems and session.exitstatus == 0:
            session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    checks, tr = _CHECKS, terminalreporter
    if checks is None:
        return
    tr.section("CI checks: skips and passes")
    if checks.strict:
        listed = sorted(n for n in checks.skips if checks.allowed(n) is not None)
        tr.write_line(f"expected skips: {len(listed)} (of {len(checks.expected)} entries in {checks.path})")
        for n in listed:
            tr.write_line(f"  {n}: {checks.allowed(n)}")
    tr.write_line(f"passed: {checks.passed} (floor {checks.min_passed})")
    if checks.problems:
        tr.write_line("CI checks FAILED:", red=True, bold=True)
        for line in checks.problems:
            tr.write_line(line, red=True)
    else:
        tr.write_line("CI checks passed: no unexpected skip" + (f", at least {checks.min_passed} passed"
                                                                  if checks.min_passed else ""), green=True)
