"""``kztts inspect``: what a bundle accepts (a TTS bundle's kind: a cloned voice, preset speakers, an instruction),
where each graph runs (QNN/HTP or CPU) and in which precision; with a target, also what each graph call costs on
paper (``kztts.htp.cost``)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kztts.bundle import graphs as G
from kztts.bundle.bundle import TOKENIZER_FILE, Bundle
from kztts.bundle.graphs import CP_MODES
from kztts.bundle.manifest import KIND_LM, random_weights_label, read_manifest
from kztts.bundle.onnx_wire import graph_read_bytes
from kztts.bundle.sessions import _session_options
from kztts.core.errors import KzttsError
from kztts.htp.cost import (SPOKEN_PROMPT, bundle_cost, first_audio, format_cost, format_first_audio, format_spoken,
                            spoken_estimate)
from kztts.htp.qnn import (
    EP_NAME,
    Placement,
    bundle_target,
    graph_files,
    open_target_session,
    qnn_available,
    qnn_unavailable_reason,
    planned_precision,
    session_precision,
)
from kztts.htp.qnn_package import check_target_skel
from kztts.htp.targets import Target, load_target
from kztts.lm import chatml
from kztts.plan.resolve import resolve_placement, resolve_plan
from kztts.tts.model_kind import ModelKind
from kztts.tts.text.split import DEFAULT_FRAMES_PER_TOKEN


def _packed_binaries(root: Path, spec) -> int:
    """The context binaries of a device bundle's graph (its file is the EPContext model that names them)."""
    if not spec.extra.get("packed_context"):
        return 0
    return sum((root / b).stat().st_size for b in spec.extra.get("context_binaries", []) if (root / b).is_file())


def _attention(graph: str) -> str:
    """``fused`` (ORT GroupQueryAttention), ``plain`` (ONNX ops: a role that also has a fused
    graph), or ``-`` (the decoder and encoders)."""
    kind = G.GRAPHS.get(graph)
    if kind is None:
        return "-"
    if kind.fused:
        return "fused"
    return "plain" if any(k.fused and k.role == kind.role for k in G.GRAPHS.values()) else "-"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.0f} kB"


def inspect_bundle(bundle_dir: str | Path, target: "str | Path | Target | None" = None, strict: bool = False,
                   precision: str | None = None, placement: str | None = None, profile: bool = False) -> dict:
    """What a bundle holds, where each graph runs and, with a target, its cost on paper, read from the files.

    Static graphs run on the target's HTP (``target`` None: the one the bundle was exported for); dynamic graphs
    on the CPU EP by design (symbolic shapes). No session is opened: each graph's row says where the target's plan
    runs it. ``strict`` or ``profile`` open every graph as ``synth --target`` would and report its node placement
    (``strict``: refused if a node of a static graph would fall back to the CPU); ``profile`` also counts the cost
    from one profiled CPU run per graph (``kztts.htp.cost.profile_graph``, the reference of the count read from
    the files; minutes on a 0.6B bundle). The cost on paper counts the HTP graphs at ``precision`` or as precision
    plan ``placement`` (a file) has them."""
    bundle = Bundle.open(bundle_dir, load_graphs=False)
    graphs = bundle.manifest.graphs
    # a plan refused in one line before any graph opens (a file for another layer count, a bad key)
    plan = resolve_placement(placement, int(bundle.manifest.talker["num_layers"])) if placement else None
    # a plain export's static graphs (cp_frame) run on the CPU: no target, the CPU plan
    exported_for_target = any(g.extra.get("target") for g in graphs.values())
    if target is not None:
        target = load_target(target)
    elif exported_for_target:
        target = load_target(bundle_target(bundle))
    # as the plan does: a target whose HTP arch has no skel in the installed QNN package is refused
    # (strict) or shown on the CPU
    missing_skel = check_target_skel(target, strict) if target is not None else None
    sessions = strict or profile
    rows = []
    for name, spec in graphs.items():
        row = {"graph": name, "variant": spec.variant, "file": spec.file, "exported_precision": spec.precision,
               "bytes": graph_read_bytes(bundle.path / spec.file) + _packed_binaries(bundle.path, spec), "attention": _attention(name), "opened": sessions}
        on_target = spec.variant == "static" and target is not None and missing_skel is None
        if sessions:
            row.update(_opened(bundle, name, spec, target if on_target else None, strict))
        else:  # where the session would run it: a static graph on the HTP when QNN is there
            on_htp = on_target and qnn_available()
            qnn_file, _ = graph_files(bundle, name)
            row.update(device="htp" if on_htp else "cpu", precision=planned_precision(spec.precision, on_htp),
                       context_binary=on_htp and qnn_file.name != Path(spec.file).name)
        rows.append(row)

    # a device bundle keeps context binaries without their source graphs, whose operators the cost counts
    packed = bundle.manifest.data.get("packed")
    return {"bundle": str(bundle_dir), "target": target.name if target else None,
            "soc": target.soc.name if target else None, "qnn_available": qnn_available(),
            "qnn_unavailable_reason": qnn_unavailable_reason(), "missing_skel": missing_skel,
            "random_weights": bundle.manifest.random_weights, "graphs": rows,
            "accepts": _accepts(bundle.manifest),
            "cost": bundle_cost(bundle_dir, target, bundle.session_config.threads, precision=precision,
                                plan=plan, measured=profile) if target and not packed else None,
            "packed": packed}


def _opened(bundle: Bundle, name: str, spec, target: Target | None, strict: bool) -> dict:
    """A graph opened as ``synth`` opens it (on the target's HTP, else the CPU EP) and where its nodes run."""
    import onnxruntime as ort

    if target is not None:
        sess = open_target_session(bundle, name, target, strict)
        qnn_file, _ = graph_files(bundle, name)
        context_binary = qnn_file.name != Path(spec.file).name and EP_NAME in sess.get_providers()
    else:
        so = _session_options(bundle.session_config)
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        sess = ort.InferenceSession(str(bundle.path / spec.file), sess_options=so, providers=["CPUExecutionProvider"])
        context_binary = False
    pl = Placement.of(sess)
    return {"context_binary": context_binary, "qnn_nodes": pl.qnn_nodes, "cpu_nodes": pl.cpu_nodes,
            "cpu_op_types": pl.cpu_op_types, "device": "htp" if pl.qnn_nodes else "cpu",
            "precision": session_precision(spec.precision, sess)}


def _accepts(manifest) -> dict | None:
    """A TTS bundle's kind and what its requests take (``kztts.tts.model_kind``); None for an LM bundle."""
    if manifest.kind != "tts":
        return None
    kind = ModelKind.of(manifest)
    return {"kind": kind.kind, "label": kind.label, "takes_instruction": kind.takes_instruction,
            "speakers": {s.name: {"id": s.id, "dialect": s.dialect} for s in kind.speakers.values()},
            "lines": kind.describe()}


def cmd_plan(args: argparse.Namespace) -> int:
    """``kztts inspect --plan``: the execution plan of a synthesis, without opening any graph."""
    bundle = Bundle.open(Path(args.bundle), load_graphs=False)
    plan = resolve_plan(bundle, target=args.target, placement=args.placement, strict=args.strict,
                        cp_mode=args.cp_mode, check_saturation=True)  # as TTS resolves it
    print(json.dumps(plan.to_json()) if args.json else plan.table())
    return 0


def prompt_tokens(lm_dir: str | Path, message: str) -> int:
    """Tokens of a chat's first prompt (the bundle's default system, ``message``, the generation prompt)."""
    from tokenizers import Tokenizer

    system = (read_manifest(Path(lm_dir)).data.get("chat") or {}).get("default_system")
    tok = Tokenizer.from_file(str(Path(lm_dir) / TOKENIZER_FILE))
    return len(tok.encode(chatml.first_turn(system, message), add_special_tokens=False).ids)


def speak_report(lm_dir: str | Path, tts_dir: str | Path, target: "str | Path | Target", precision: str | None = None,
                 message: str = SPOKEN_PROMPT, first_chunk: int = 1, profile: bool = False) -> dict:
    """An LM that speaks at ``target``, on paper: both bundles' costs, whether a reply keeps real time
    (``spoken_estimate``) and the first audio after ``message``, stage by stage (``first_audio``)."""
    kinds = {name: read_manifest(Path(d)).kind for name, d in (("LM", lm_dir), ("TTS", tts_dir))}
    label = {KIND_LM: "an LM", "tts": "a TTS"}
    if kinds["LM"] != KIND_LM:
        raise KzttsError(f"{lm_dir}: {label.get(kinds['LM'], 'a ' + kinds['LM'])} bundle; inspect --speak takes an LM "
                         "bundle first (kztts inspect LM --target T --speak TTS)")
    if kinds["TTS"] != "tts":
        raise KzttsError(f"--speak {tts_dir}: {label.get(kinds['TTS'], 'a ' + kinds['TTS'])} bundle; give a TTS bundle")
    target = load_target(target)
    lm = bundle_cost(lm_dir, target, precision=precision, measured=profile)
    tts = bundle_cost(tts_dir, target, precision=precision, measured=profile)
    return {"target": target.name, "lm": lm, "tts": tts,
            "spoken": spoken_estimate(lm, tts, DEFAULT_FRAMES_PER_TOKEN),
            "first_audio": first_audio(lm_dir, lm, tts_dir, tts, target, prompt_tokens(lm_dir, message), first_chunk)}


def cmd_speak(args: argparse.Namespace) -> int:
    """``kztts inspect LM --target T[,T2...] --speak TTS``: per target, the first audio after a chat message."""
    reports = [speak_report(args.bundle, args.speak, t, args.precision, args.message, args.first_chunk,
                            args.profile) for t in args.target.split(",")]
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0]))
        return 0
    for i, r in enumerate(reports):
        if len(reports) == 1:
            print(format_cost(r["lm"]), format_cost(r["tts"]), format_spoken(r["spoken"]), sep="\n\n")
            print()
        elif i:
            print()
        print(format_first_audio(r["first_audio"]))
    if len(reports) > 1:
        print()
        print("first audio on paper: " + ", ".join(
            f"{r['target']} {r['first_audio']['total_ms']:.0f} ms" if r["first_audio"]["available"] else
            f"{r['target']} n/a" for r in reports))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    if args.plan:
        return cmd_plan(args)
    if args.speak and not args.target:
        raise KzttsError("--speak counts an LM and a TTS bundle on paper at a target: give --target T (or T1,T2)")
    if args.speak and not Path(args.speak).is_dir():
        raise KzttsError(f"--speak {args.speak}: no such bundle directory; give a TTS bundle")
    if (args.precision or args.placement) and not args.target:
        raise KzttsError("--precision and --placement count the cost on paper of a target: give --target T "
                         "(or --plan for the execution plan)")
    if args.speak and args.placement:
        raise KzttsError("--placement is a Talker's precision plan: not with --speak")
    if args.speak:
        return cmd_speak(args)
    report = inspect_bundle(Path(args.bundle), args.target, args.strict, args.precision, args.placement,
                            profile=args.profile)
    if args.json:
        print(json.dumps(report))
        return 0
    head = f"target {report['target']} ({report['soc']})" if report["target"] else "no target (CPU only)"
    if report["target"] and not report["qnn_available"]:
        head += f"; QNN unavailable: {report['qnn_unavailable_reason']}"
    if report["missing_skel"]:
        head += f"; on the CPU: {report['missing_skel']}"
    print(head)
    for line in (report["accepts"] or {}).get("lines", []):
        print(line)
    if report["random_weights"]:
        print(f"random weights ({random_weights_label(report['random_weights'])}): not a real checkpoint")
    opened = any(r["opened"] for r in report["graphs"])
    if opened:  # --profile / --strict: where ONNX Runtime placed each node
        print(f"{'graph':<22}{'variant':<9}{'attention':<10}{'size':>10}{'QNN':>6}{'CPU':>6}  {'precision':<24}"
              "CPU op types")
    else:
        print(f"{'graph':<22}{'variant':<9}{'attention':<10}{'size':>10}  {'runs on':<8}precision")
    for r in report["graphs"]:
        prec = r["precision"] + (" [ctx]" if r["context_binary"] else "")
        head = f"{r['graph']:<22}{r['variant']:<9}{r['attention']:<10}{_size(r['bytes']):>10}"
        if not opened:
            print(f"{head}  {r['device']:<8}{prec}")
            continue
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(r["cpu_op_types"].items())) if r["qnn_nodes"] else \
            ("(all)" if r["cpu_nodes"] else "")
        print(f"{head}{r['qnn_nodes']:>6}{r['cpu_nodes']:>6}  {prec:<24}{ops}")
    if not opened:
        print("(from the files, no graph opened; --profile opens each as synth would and shows where its nodes run)")
    if not report["target"]:
        args.target = None
        print()
        return cmd_plan(args)

    print()
    if report["packed"]:
        print(f"a device bundle (kztts pack for {report['packed']['target']}): its context binaries carry no "
              f"graph to count; the cost on paper is the full bundle's: kztts inspect {report['packed']['from']} "
              f"--target {report['target']}")
        return 0
    print(format_cost(report["cost"]))
    return 0


def add_command(sub) -> None:
    s = sub.add_parser("inspect", help="show where each graph of a bundle runs (QNN/HTP or CPU) and its precision; "
                                       "with --target, each graph call's bytes and MACs and a paper estimate per frame")
    s.add_argument("bundle", help="the bundle to describe (a TTS or an LM bundle; demo: the embedded demo's)")
    s.add_argument("--target", help="qnn_configs target (name or file); default: the one the bundle was exported for")
    s.add_argument("--strict", action="store_true", help="open each graph as synth would and fail if any node of a "
                                                          "static graph would fall back to CPU")
    s.add_argument("--profile", action="store_true",
                   help="open each graph as synth would (where each node runs) and count the cost on paper from one "
                        "profiled CPU run per graph instead of the files (the reference count; minutes on a 0.6B "
                        "bundle)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--plan", action="store_true",
                   help="print the execution plan of `kztts synth` with these options instead (no graph is opened)")
    s.add_argument("--placement", help="with --plan: a Talker layer placement (as for synth); with --target: a "
                                       "precision plan (`kztts calibrate --plan`) the cost on paper counts")
    s.add_argument("--precision", choices=G.HTP_PRECISIONS,
                   help="with --target: count the HTP graphs' weights at this precision on paper (default: the "
                        "target's; a QDQ graph counts as stored; an int4/int8 CPU graph's MatMulNBits weights as "
                        "stored unless a precision is given)")
    s.add_argument("--speak", metavar="TTS_BUNDLE",
                   help="with --target (T or T1,T2,...) and an LM bundle: both bundles' costs, whether an LM token "
                        "plus the frames of speech it makes keep real time, and the first audio after a chat message "
                        "stage by stage (LM prefill, first tokens, Talker prefill, first frame, first decoder run), "
                        "on paper (kztts chat --speak)")
    s.add_argument("--message", default=SPOKEN_PROMPT,
                   help="with --speak: the chat message whose prompt the LM prefills (default: %(default)r)")
    s.add_argument("--first-chunk", type=int, default=1,
                   help="with --speak: frames of the first decoder run (default: %(default)s, as stream)")
    s.add_argument("--cp-mode", choices=CP_MODES, default="frame", help="with --plan: Code Predictor mode")
    s.set_defaults(func=cmd_inspect)


__all__ = ["add_command", "inspect_bundle"]
