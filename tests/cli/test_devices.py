"""``kztts devices``: this machine's EP devices, the QNN backend and skels, and which shipped
targets can run here."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_devices_json_lists_the_cpu_and_the_qnn_simulator():
    pytest.importorskip("onnxruntime_qnn", reason="the QNN simulator ships in onnxruntime-qnn's x86-64 wheel")
    from kztts.htp.qnn_package import host_is_simulator

    if not host_is_simulator():
        pytest.skip("the HTP simulator runs on x86-64 hosts only")
    # a subprocess: the probe session must not share this process's QNN backend state (fp16 mode leaks)
    env = {k: v for k, v in os.environ.items() if k not in ("KZTTS_QNN_PACKAGE_DIR", "KZTTS_DISABLE_QNN")}
    out = subprocess.run([sys.executable, "-m", "kztts.cli.main", "devices", "--json"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    eps = {(d["ep"], d["type"]) for d in rep["ep_devices"]}
    assert ("CPUExecutionProvider", "CPU") in eps and any(ep == "QNNExecutionProvider" for ep, _ in eps)
    q = rep["qnn"]
    assert q["available"] and q["backend"] == "simulator"
    assert q["package"]["htp_backend"].endswith("libQnnHtp.so") and q["package"]["skels"] == []
    assert q["probe"]["ran"] and q["probe"]["htp_arch"] is None  # the simulator reports no arch of its own
    rows = {r["target"]: r for r in rep["targets"]}
    assert {"x_elite", "x2_elite", "simulator"} <= set(rows)
    assert all(r["status"] == "simulator" for r in rows.values())


def test_target_rows_name_the_missing_skel(tmp_path, monkeypatch):
    from kztts.cli.devices import target_rows

    (tmp_path / "libQnnHtpV73Skel.so").write_bytes(b"\0")
    monkeypatch.setenv("KZTTS_QNN_PACKAGE_DIR", str(tmp_path))
    device = {"available": True, "unavailable_reason": None, "backend": "device", "probe": None}
    rows = {r["target"]: r for r in target_rows(device)}
    assert rows["x_elite"]["status"] == "ok" and "libQnnHtpV73Skel.so" in rows["x_elite"]["why"]
    assert rows["x2_elite"]["status"] == "no" and "libQnnHtpV81Skel.so" in rows["x2_elite"]["why"]
    probed = dict(device, probe={"htp_arch": 81})  # an X2 Elite whose package lacks nothing but reports v81
    (tmp_path / "libQnnHtpV81Skel.so").write_bytes(b"\0")
    rows = {r["target"]: r for r in target_rows(probed)}
    assert rows["x2_elite"]["status"] == "ok" and rows["x_elite"]["status"] == "no"
    assert "reports v81" in rows["x_elite"]["why"]
    off = dict(device, available=False, unavailable_reason="disabled by KZTTS_DISABLE_QNN")
    assert {r["status"] for r in target_rows(off)} == {"cpu"}


def test_the_text_report_explains_the_qnn_cpu_device_instead_of_the_loader_error():
    """The QNN EP's CPU device needs libQnnCpu.so, which onnxruntime-qnn does not ship: the text says why the row is
    unused rather than quoting the loader; any other incompatibility keeps ONNX Runtime's own notes."""
    from kztts.cli.devices import device_note

    loader = {"notes": "Unable to load backend, error:  libQnnCpu.so: cannot open shared object file"}
    qnn_cpu = {"ep": "QNNExecutionProvider", "type": "CPU", "incompatibility": loader}
    assert device_note(qnn_cpu) == "; not used: kztts runs QNN on its HTP backend only (QNN's CPU backend is not shipped)"
    other = {"ep": "QNNExecutionProvider", "type": "NPU", "incompatibility": {"notes": "driver too old"}}
    assert device_note(other) == "; ONNX Runtime notes: driver too old"
    assert device_note({"ep": "CPUExecutionProvider", "type": "CPU", "incompatibility": None}) == ""
    pytest.importorskip("onnxruntime_qnn", reason="the QNN EP ships in onnxruntime-qnn")
    out = subprocess.run([sys.executable, "-m", "kztts.cli.main", "devices"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "libQnnCpu" not in out.stdout + out.stderr, out.stdout + out.stderr
