"""``kztts devices``: what this machine offers to kztts (ONNX Runtime's EP devices, the QNN
package, its HTP backend and skels) and which shipped targets can run here.

Probing is cheap: the EP devices come from ONNX Runtime's device API after the QNN plugin
is registered, the package from its folder (``kztts.htp.qnn_package``). The HTP arch the backend
reports needs one session: a one-node graph (built with ``onnx`` when it is installed) is
compiled to an EPContext model in a temporary folder and its compatibility string read;
``--no-probe`` skips it. Without ``soc_model``/``htp_arch`` options the x86-64 simulator
reports arch 0 (it simulates whatever a session asks for); a device reports its own.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from kztts.htp.qnn import _STATE, EP_NAME, _native_output_to_log, qnn_available, qnn_unavailable_reason
from kztts.htp.qnn import first_line
from kztts.htp.qnn_package import find_package, host_is_simulator, skel_problem
from kztts.htp.targets import TargetError, list_targets, load_target

_TYPES = {0: "CPU", 1: "GPU", 2: "NPU"}


def ep_devices() -> list[dict]:
    """Every (execution provider, hardware device) pair ONNX Runtime offers, QNN registered first."""
    import onnxruntime as ort


    qnn_available()  # registers the plugin EP when it can: its devices appear only then
    try:
        from onnxruntime.capi._pybind_state import get_hardware_device_ep_incompatibility_details as incompat
    except ImportError:  # an older ONNX Runtime
        incompat = None
    out = []
    for d in ort.get_ep_devices():
        hw = d.device
        row = {"ep": d.ep_name, "ep_vendor": d.ep_vendor, "type": _TYPES.get(int(hw.type), str(hw.type)),
               "vendor": hw.vendor, "vendor_id": hw.vendor_id, "device_id": hw.device_id,
               "metadata": dict(hw.metadata), "ep_metadata": dict(d.ep_metadata), "incompatibility": None}
        if incompat is not None:
            try:
                info = incompat(d.ep_name, hw)
            except Exception as exc:  # a probe, not a requirement
                info = {"reasons_bitmask": None, "notes": first_line(exc, limit=300), "error_code": None}
            if info.get("reasons_bitmask"):
                row["incompatibility"] = info
        out.append(row)
    return out


def probe_htp_arch(backend_path: str) -> dict:
    """The HTP arch and SoC model the QNN backend reports for a session without ``soc_model``/``htp_arch``
    (0 = none reported), read from the compatibility string of a compiled one-node graph."""
    try:
        from onnx import TensorProto, helper
    except ImportError:
        return {"htp_arch": None, "soc_model": None, "note": "not probed: building the probe graph needs the onnx "
                                                             "package (pip install onnx)"}
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.capi._pybind_state import get_compatibility_info_from_model


    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    with tempfile.TemporaryDirectory(prefix="kztts-probe-") as tmp:
        ctx = Path(tmp) / "probe_ctx.onnx"
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", str(ctx))
        so.add_session_config_entry("ep.context_embed_mode", "1")
        so.add_provider_for_devices(_STATE.devices, {"backend_path": backend_path})
        try:
            with _native_output_to_log():
                sess = ort.InferenceSession(model.SerializeToString(), sess_options=so)
                out = sess.run(None, {"x": np.ones((1, 8), np.float32)})[0]
            info = get_compatibility_info_from_model(str(ctx), EP_NAME)
        except Exception as exc:
            return {"htp_arch": None, "soc_model": None, "note": f"probe session failed: {first_line(exc, limit=300)}"}
    # "v2:<backend id>:<QNN SDK>:<API>:<htp arch>:<soc model>:...", as onnxruntime-qnn 2.7.0 writes it
    fields = (info or "").split(":")
    arch = int(fields[4]) if len(fields) > 5 and fields[4].isdigit() else None
    soc = int(fields[5]) if len(fields) > 5 and fields[5].isdigit() else None
    return {"htp_arch": arch or None, "soc_model": soc or None, "compatibility_info": info,
            "ran": bool(np.allclose(out, 2.0, atol=1e-2)),
            "note": "the backend reports no HTP arch" if not arch else f"the backend reports HTP v{arch}"}


def qnn_report(probe: bool) -> dict:
    """The QNN package, whether its EP loads, its backend (simulator or device) and, probed, its HTP arch."""
    package = find_package()
    available = qnn_available()
    rep = {"available": available, "unavailable_reason": qnn_unavailable_reason(),
           "package": package.to_json() if package else None,
           "backend": "simulator" if host_is_simulator() else "device", "probe": None}
    if available and probe and package is not None and package.htp_backend is not None:
        rep["probe"] = probe_htp_arch(str(package.htp_backend))
    return rep


def target_rows(qnn: dict) -> list[dict]:
    """Each shipped target: ``ok`` (a skel for its arch here), ``simulator`` (the host simulator runs it),
    ``cpu`` (no QNN: its HTP graphs would run on the CPU EP) or ``no`` (why), and ``invalid`` files."""
    package = find_package()
    reported = (qnn.get("probe") or {}).get("htp_arch")
    rows = []
    for name in list_targets():
        try:
            t = load_target(name)
        except TargetError as exc:
            rows.append({"target": name, "status": "invalid", "why": str(exc)})
            continue
        row = {"target": t.name, "soc": t.soc.name, "htp_arch": t.soc.htp_arch, "runs_on": t.runs_on}
        problem = skel_problem(t, package)
        if not qnn["available"]:
            row.update(status="cpu", why=f"QNN unavailable ({qnn['unavailable_reason']}): its HTP graphs would run "
                                         "on the CPU EP (strict mode fails)")
        elif problem:
            row.update(status="no", why=problem)
        elif reported and reported != t.soc.htp_arch:
            row.update(status="no", why=f"this machine's HTP reports v{reported}, the target is v{t.soc.htp_arch}")
        elif qnn["backend"] == "simulator":
            row.update(status="simulator", why="the x86-64 HTP simulator runs it: exact numerics and partitioning, "
                                               "no timing")
        else:
            skel = package.skels.get(t.soc.htp_arch) if package else None
            row.update(status="ok", why=(f"skel {skel.name} installed" if skel else "no skel list to check")
                       + (f"; the HTP reports v{reported}" if reported else "; the SoC itself is not checked"))
        rows.append(row)
    return rows


def devices_report(probe: bool = True) -> dict:
    """Everything ``kztts devices`` prints."""
    import onnxruntime as ort

    devices = ep_devices()
    qnn = qnn_report(probe)
    return {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "ep_devices": devices,
            "qnn": qnn, "targets": target_rows(qnn)}


def device_note(d: dict) -> str:
    """What the text report says of a device ONNX Runtime finds incompatible. The QNN EP's CPU device needs QNN's
    CPU backend, which onnxruntime-qnn does not ship: the loader's "Unable to load backend libQnnCpu.so" is
    expected, and kztts never uses that backend (QNN runs on the HTP backend only)."""
    if not d["incompatibility"]:
        return ""
    notes = str(d["incompatibility"].get("notes") or "")
    if d["ep"] == "QNNExecutionProvider" and d["type"] == "CPU" and "libQnnCpu" in notes:
        return "; not used: kztts runs QNN on its HTP backend only (QNN's CPU backend is not shipped)"
    return f"; ONNX Runtime notes: {notes}"


def _print_text(rep: dict) -> None:
    print(f"ONNX Runtime {rep['onnxruntime']}; providers: {', '.join(rep['providers'])}")
    print("EP devices:")
    for d in rep["ep_devices"]:
        extra = device_note(d)
        print(f"  {d['ep']:<24} {d['type']:<4} {d['vendor']} (vendor id {d['vendor_id']}, "
              f"device {d['device_id']}), EP by {d['ep_vendor']}{extra}")
    q = rep["qnn"]
    pkg = q["package"]
    if pkg is None:
        print("QNN: no onnxruntime-qnn package (pip install 'kztts[qnn]')")
    else:
        print(f"QNN: onnxruntime-qnn {pkg['version']} (QNN SDK {pkg['qnn_sdk']}) at {pkg['path']}")
        print(f"  EP {'loaded' if q['available'] else 'unavailable: ' + str(q['unavailable_reason'])}; "
              f"HTP backend {pkg['htp_backend']} ({q['backend']})")
        skels = ", ".join(f"{s['file']} (v{s['htp_arch']})" for s in pkg["skels"])
        print(f"  HTP skels: {skels or 'none shipped (simulator: every arch runs)'}")
        if q["probe"]:
            print(f"  probe: {q['probe']['note']}")
    print("targets:")
    for t in rep["targets"]:
        print(f"  {t['target']:<12} {t['status']:<10} {t['why']}")


def cmd_devices(args: argparse.Namespace) -> int:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the probes' EP warnings (file-mapped weights, ...) are not for the user
    rep = devices_report(probe=not args.no_probe)
    if args.json:
        print(json.dumps(rep))
    else:
        _print_text(rep)
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("devices", help="what this machine offers (EP devices, QNN backend, HTP skels) and which "
                                       "targets can run here")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--no-probe", action="store_true",
                   help="skip the one-node session that asks the QNN backend for its HTP arch")
    s.set_defaults(func=cmd_devices)


__all__ = ["add_command", "devices_report", "ep_devices", "probe_htp_arch", "qnn_report", "target_rows"]
