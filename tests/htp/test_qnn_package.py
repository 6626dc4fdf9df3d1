"""Targets for the laptops: the X2 Elite (v81) target, hyphenated target names, and the HTP-skel
check (``kztts.htp.qnn_package``) the plan applies before any HTP work: a package that ships skels
refuses (strict) or sends to the CPU (one warning) a target whose arch it lacks."""
from __future__ import annotations

import logging

import pytest

from kztts.core.errors import KzttsError
from kztts.htp.targets import load_target


@pytest.fixture
def v73_package(tmp_path, monkeypatch):
    """A fake onnxruntime_qnn folder laid out like the win_arm64 wheel, with the v73 skel only."""
    pkg = tmp_path / "onnxruntime_qnn"
    pkg.mkdir()
    for name in ("QnnHtp.dll", "QnnHtpV73Stub.dll", "libQnnHtpV73Skel.so", "libqnnhtpv73.cat",
                 "onnxruntime_providers_qnn.dll"):
        (pkg / name).write_bytes(b"\0")
    (pkg / "build_and_package_info.py").write_text("package_name = 'onnxruntime-qnn'\n__version__ = '2.7.0'\n"
                                                   "qnn_version = '2.51.0'\n")
    monkeypatch.setenv("KZTTS_QNN_PACKAGE_DIR", str(pkg))
    return pkg


def test_x2_elite_target_and_hyphenated_names():
    t = load_target("x2_elite")
    assert (t.soc.name, t.soc.soc_model, t.soc.htp_arch, t.runs_on) == ("SC8480XP", 88, 81, "device")
    assert load_target("x2-elite") == t
    assert load_target("x-elite").name == "x_elite" and load_target("x-elite").soc.htp_arch == 73
    with pytest.raises(KzttsError, match="unknown target 'x3-elite'"):
        load_target("x3-elite")


def test_package_listing_finds_skels_by_arch(v73_package):
    from kztts.htp.qnn_package import find_package, find_skels

    (v73_package / "arm64").mkdir()
    (v73_package / "arm64" / "libQnnHtpV81Skel.so").write_bytes(b"\0")
    (v73_package / "libQnnHtpV81Stub.so").write_bytes(b"\0")  # a stub is not a skel
    assert {a: p.name for a, p in find_skels(v73_package).items()} == {73: "libQnnHtpV73Skel.so",
                                                                       81: "libQnnHtpV81Skel.so"}
    pkg = find_package()
    assert (pkg.path, pkg.version, pkg.qnn_sdk) == (v73_package, "2.7.0", "2.51.0")
    assert pkg.htp_backend.name == "QnnHtp.dll" and pkg.ep_library.name == "onnxruntime_providers_qnn.dll"


def test_missing_skel_refuses_in_strict_mode_with_one_line(plain_bundle, v73_package):
    from kztts.htp.qnn_package import MissingSkelError
    from kztts.plan.resolve import resolve_plan

    with pytest.raises(MissingSkelError) as info:
        resolve_plan(plain_bundle, target="x2-elite", strict=True)
    msg = str(info.value)
    assert "\n" not in msg and "v81" in msg and "libQnnHtpV81Skel.so" in msg and "libQnnHtpV73Skel.so (v73)" in msg
    with pytest.raises(MissingSkelError):  # a layer placement with HTP layers is refused the same way
        resolve_plan(plain_bundle, target="x2_elite", placement="all-htp", strict=True)


def test_missing_skel_falls_back_to_cpu_with_one_warning(plain_bundle, v73_package, caplog):
    from kztts.plan.resolve import resolve_plan

    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            plan = resolve_plan(plain_bundle, target="x2_elite")
            assert plan.runner == "cpu" and all(s.device == "cpu" for s in plan.steps.values())
            assert "fallback" in plan.steps["code_predictor"].reason and "v81" in plan.steps["code_predictor"].reason
        placed = resolve_plan(plain_bundle, target="x2_elite", placement="prefill-htp-decode-cpu")
    assert placed.runner == "cpu" and placed.placement.mode == "all-cpu"
    assert "v81" in placed.steps["talker_prefill"].reason
    skel_warnings = [r for r in caplog.records if "libQnnHtpV81Skel.so" in r.getMessage()]
    assert len(skel_warnings) == 1


def test_target_with_a_shipped_skel_passes(plain_bundle, v73_package):
    from kztts.core.errors import BundleError
    from kztts.htp.qnn_package import check_target_skel
    from kztts.plan.resolve import resolve_plan

    assert check_target_skel(load_target("x_elite"), strict=True) is None
    # past the skel check, the plain bundle's missing static graphs are what strict mode names
    with pytest.raises(BundleError, match="no static graph 'talker_prefill'"):
        resolve_plan(plain_bundle, target="x_elite", strict=True)


def test_a_package_without_skels_refuses_nothing(tmp_path, monkeypatch):
    from kztts.htp.qnn_package import check_target_skel

    (tmp_path / "libQnnHtp.so").write_bytes(b"\0")  # the linux x86_64 wheel: a simulator, no skel
    monkeypatch.setenv("KZTTS_QNN_PACKAGE_DIR", str(tmp_path))
    assert check_target_skel(load_target("x2_elite"), strict=True) is None
    monkeypatch.setenv("KZTTS_QNN_PACKAGE_DIR", str(tmp_path / "missing"))
    with pytest.raises(KzttsError, match="KZTTS_QNN_PACKAGE_DIR=.*not a folder"):
        check_target_skel(load_target("x2_elite"), strict=False)


def test_inspect_applies_the_skel_check(plain_bundle, v73_package):
    """``kztts inspect --target`` opens static graphs itself: a target without its skel is refused
    (strict) or shown on the CPU, as the plan does, without compiling anything for the HTP."""
    from kztts.cli.inspect import inspect_bundle
    from kztts.htp.qnn_package import MissingSkelError

    with pytest.raises(MissingSkelError, match="v81"):
        inspect_bundle(plain_bundle.path, "x2-elite", strict=True)
    report = inspect_bundle(plain_bundle.path, "x2-elite")
    assert "v81" in report["missing_skel"]
    static = [g for g in report["graphs"] if g["variant"] == "static"]
    assert static and all(g["device"] == "cpu" and not g["context_binary"] for g in static)
    opened = inspect_bundle(plain_bundle.path, "x2-elite", profile=True)  # each graph opened: none on QNN
    assert all(g["qnn_nodes"] == 0 and not g["context_binary"] for g in opened["graphs"] if g["variant"] == "static")
