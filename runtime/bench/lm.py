"""LM rows of ``kztts bench --lm SOURCE`` (and ``benchmarks/lm_precision/bench_lm.py``): which precision and
placement are safe for a causal LM.

Rows (``kztts.eval.lm_accuracy``, all against the fp32 CPU bundle, teacher-forced over its fixed
multilingual text set, plus 32 greedy tokens per prompt):

- CPU fp32 / int8 / int4 (``kztts export --weights``: MatMulNBits, blocks of 128), with the
  median ms per decode step at ``--threads`` and the load average beside it;
- with ``--target``: the HTP simulator in fp16 under all-htp (the static graphs),
  guarded (``kztts calibrate``'s placement, run on the layer graphs with the fp16 guard on) and
  prefill-htp-decode-cpu (KV handover); in each quantized precision (w8a16, w4a16: a bundle each, the static
  graphs quantized, calibrated on text by ``kztts.export.lm.text_calibration``) under all-htp and
  prefill-htp-decode-cpu. A quantized guarded row does not exist: the layer graphs are fp16 (the exporter
  refuses ``--segments`` with a quantized precision; its message is quoted in the report); a precision plan
  given as a placement file runs on the layer graphs with their QDQ variants. HTP rows are never timed (the
  simulator is not a device). A bundle with ``--segments`` layer graphs but no whole-stack static
  graphs (a 1.5B's, ``benchmarks/lm_precision/simulator_lm512.json``) runs the fp16 rows on its layer graphs,
  with the guard counting flagged HTP calls (``guard_flagged``) rather than failing the row; QNN
  itself stays strict (no CPU fallback). A target with ``process_context_mb`` opens the HTP graphs
  in host processes (``kztts.htp.hosts``); each row's JSON lists them (``htp_hosts``).
- with ``--qdq-on-cpu``: the quantized precisions' HTP rows (``qdq-cpu w4a16 all-htp``, ...) run the same QDQ
  graphs on ONNX Runtime's CPU EP instead of the simulator: the quantization grid the HTP is given (weights and
  16-bit activations), with fp32 arithmetic between the Q/DQ pairs where the HTP computes in fp16; minutes where
  the simulator takes hours (on the tiny Qwen3 its w8a16 rows land within 0.001 of the simulator's in cosine).
  fp16 rows have no QDQ nodes to emulate and are refused.

Each finished row is logged and ``lm_accuracy.json`` rewritten (``"complete": false`` until the
last row), so a long simulator run keeps the rows it finished. ``lm_accuracy.md`` holds the table,
its caveats and the command. The rows need the export extra (torch: variant export, calibration).

With ``ray`` (``--ray [ADDRESS]``) every (row, text) is a unit of ``kztts.bench.ray_units``: a Ray task
(``kztts.eval.lm_accuracy.run_text`` in its own process) kept in ``OUT/units`` as it finishes, the fp32
row's unit of a text first (the others of that text are measured against its logits); the rows are made
from the units' per-text sums (``rows_from_texts``), the table a sequential run gives. CPU rows (timed)
get a whole node each. Reports carry the ``code_version`` of the rows' code (``ray_units.code_version``):
``merge`` refuses runs of different code, as it refuses runs of different bundles.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import psutil

from kztts.bench import ray_units
from kztts.bundle import graphs as G
from kztts.bundle.manifest import bundle_digest, read_manifest
from kztts.bundle.segments import segment_graph_name
from kztts.core.cache import portable_command, portable_path
from kztts.core.errors import KzttsError
from kztts.eval.calibrate import DEFAULT_THRESHOLD, calibrate, load_prompts
from kztts.eval.lm_accuracy import (
    GREEDY_STEPS,
    SAMPLES,
    RowSpec,
    Sample,
    context_limit,
    markdown_table,
    merge_rows,
    rows_from_texts,
    run_rows,
)
from kztts.htp import qnn
from kztts.htp.placement import write_placement
from kztts.htp.targets import load_target

log = logging.getLogger(__name__)

PLACEMENTS = ("all-htp", "guarded", "prefill-htp-decode-cpu")
HTP_PRECISIONS = G.HTP_PRECISIONS  # float rows from the bundle, a quantized precision's from a bundle of its own
INT4_CAVEAT = ("The checkpoint is a GGUF whose weights already lie on a 4-bit grid (Q4_K_M): re-quantizing them "
               "to int4 (blocks of 128) flatters int4; on a full-precision checkpoint int4 would lose more.")


def quantized_guarded_refusal(source: Path, target: str, precision: str) -> str:
    """The exporter's own message for layer graphs at quantized ``precision`` (refused before anything loads):
    why there is no guarded row at that precision."""
    from kztts.export.lm.bundle_writer import export_lm_bundle

    with tempfile.TemporaryDirectory() as tmp:
        try:
            export_lm_bundle(source, Path(tmp) / "b", target=target, precision=precision, segments=True)
        except KzttsError as e:
            return str(e)
    return f"accepted (unexpected: add a {precision} guarded row)"


def guarded_placement(bundle: Path, out: Path, prompts: Path | None = None) -> Path:
    """``kztts calibrate`` over ``prompts`` (default: the text set's prompts; each as a chat message):
    the guarded placement, with its report (``guarded.report.json``) and plot beside it."""
    if prompts is None:
        prompts = out / "prompts.txt"
        prompts.write_text("\n".join(s.prompt.replace("\n", " ") for s in SAMPLES) + "\n", encoding="utf-8")
    report = calibrate(bundle, load_prompts(prompts), frames=4, threshold=DEFAULT_THRESHOLD, progress=True)
    placement = out / "guarded.json"
    write_placement(report.placement(), placement)
    (out / "guarded.report.json").write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    report.plot(out / "guarded.png")
    return placement


def layer_graphs_only(bundle: Path) -> bool:
    """The bundle has the per-layer graphs (``--segments``) but no whole-stack static graphs."""
    graphs = read_manifest(bundle).graphs
    return segment_graph_name("prefill", 0) in graphs and "talker_prefill" not in graphs


def plan_label(bundle: Path) -> str:
    """`` plan`` for a bundle whose whole-stack graphs were exported with a precision plan (``kztts export
    --placement``: some MatMuls at another precision than the graph's), so its rows say so; else empty."""
    spec = read_manifest(bundle).graphs.get("talker_prefill")
    return " plan" if spec is not None and spec.extra.get("matmul_precisions") else ""


def row_specs(bundle: Path, weights: list[str], target: str | None, placements: list[str], out: Path,
              calibrate_prompts: Path | None = None, precisions: tuple[str, ...] = ("fp16",),
              quantized_bundles: dict[str, Path] | None = None, guarded: Path | None = None,
              qdq_on_cpu: bool = False) -> list:
    """CPU rows of ``bundle``'s variants; with ``target``, per HTP precision: float (fp16) rows of ``bundle``,
    a quantized precision's rows of ``quantized_bundles[precision]`` (no guarded row: its layer graphs would be
    fp16; ``w4a16 plan`` when that bundle's whole-stack graphs carry a precision plan, :func:`plan_label`).
    ``guarded``: the guarded row's placement file (default: ``kztts calibrate`` now). A placement that is a file (a
    ``kztts-placement/1`` file, e.g. one layer of a per-layer sweep on the HTP, or a precision plan) is a row of its
    own on ``bundle``, named after the file and run as the guarded row is. ``qdq_on_cpu``: the quantized rows are
    named ``qdq-cpu ...`` and run without strict mode (their graphs open on the CPU EP by design)."""
    from kztts.export.common.variants import cached_variant

    specs = [RowSpec(f"cpu {w}", cached_variant(bundle, weights=w), weights=w) for w in weights]
    layers = target is not None and layer_graphs_only(bundle)
    for prec in precisions if target else ():
        for p in placements:
            quantized = G.htp_precision(prec).quantized
            if p not in PLACEMENTS:  # a placement file (a layer sweep, a plan): as the guarded row, on the layer graphs
                if not quantized:
                    specs.append(RowSpec(f"htp-sim {prec} {Path(p).stem}", bundle, target=target, check_saturation=True,
                                         guard_counts=layers, placement=str(Path(p).resolve())))
            elif quantized:
                if p != "guarded":
                    qb = (quantized_bundles or {})[prec]
                    specs.append(RowSpec(f"{'qdq-cpu' if qdq_on_cpu else 'htp-sim'} {prec}{plan_label(qb)} {p}",
                                         qb, target=target, placement=p,
                                         strict=not qdq_on_cpu))
            elif p == "guarded":
                placement = guarded or guarded_placement(bundle, out, calibrate_prompts)
                specs.append(RowSpec(f"htp-sim {prec} guarded", bundle, target=target, check_saturation=True,
                                     guard_counts=layers, placement=str(placement)))
            else:
                specs.append(RowSpec(f"htp-sim {prec} {p}", bundle, target=target, placement=p,
                                     check_saturation=layers, guard_counts=layers))
    return specs


def model_facts(manifest: dict) -> dict:
    """What a report says of the model it measured, read from the bundle's manifest: its type and its
    source checkpoint's file name and sha256 (never a path: reports are read on other machines)."""
    src = manifest.get("source") or {}
    return {"model_type": manifest.get("model_type"), "source": Path(src.get("path", "?")).name,
            "sha256": src.get("sha256"), "gguf": bool(src.get("gguf"))}


def report_markdown(rows: list[dict], model: dict, threads: int | str, texts: str | None, steps: int,
                    no_guarded: dict | None, command: str, qdq_on_cpu: bool = False) -> str:
    subset = f" (texts: {texts})" if texts else ""
    lines = [f"LM `{model.get('model_type')}` from `{model.get('source')}` "
             f"(sha256 {str(model.get('sha256') or '')[:12]}...), {threads} threads, "
             f"{rows[0].get('tokens')} teacher-forced positions{subset}, {steps} greedy tokens per "
             "prompt.", "",
             markdown_table(rows), ""]
    if model.get("gguf"):
        lines.append(f"- **int4 caveat**: {INT4_CAVEAT}")
    lines += ["- logits cos / top-1 agree: teacher-forced against the fp32 CPU bundle; greedy prefix: mean "
              "fraction of the greedy tokens equal to fp32's before the first divergence; greedy equal: prompts "
              "whose tokens are all equal.",
              "- ms/token: median decode step (CPU rows only), the 1-minute load average beside it: compare rows "
              "of one run, not absolute figures."]
    if qdq_on_cpu:
        lines.append("- qdq-cpu rows: the target's quantized HTP graphs run by ONNX Runtime's CPU EP, not the "
                     "simulator: the same quantization grid (weights, 16-bit activations), fp32 arithmetic between "
                     "the Q/DQ pairs where the HTP computes in fp16.")
    for prec, why in (no_guarded or {}).items():
        lines.append(f"- HTP {prec}: static graphs calibrated on `kztts.export.lm.text_calibration.CALIBRATION_TEXTS` "
                     f"(disjoint from the measured texts); no guarded row, the exporter refuses {prec} layer graphs: "
                     f"\"{why}\"")
    lines += ["", "Command:", "", f"    {command}"]
    return "\n".join(lines) + "\n"


@dataclass
class LmBench:
    """What one LM benchmark run measures (the flags of ``kztts bench --lm`` / ``bench_lm.py``)."""

    source: Path  # a GGUF file or a Hugging Face directory
    out: Path
    command: str  # the command line, for the report
    bundle: Path | None = None
    weights: tuple[str, ...] = ("fp32", "int8", "int4")
    target: str | None = None
    placements: tuple[str, ...] = PLACEMENTS
    precisions: tuple[str, ...] = HTP_PRECISIONS
    quantized_bundles: dict | None = None  # {quantized precision: its LM bundle} (default: exported into the cache)
    calibrate_prompts: Path | None = None
    guarded_placement: Path | None = None
    texts: str | None = None
    greedy_steps: int | None = None
    reference: Path | None = None
    threads: int = 2
    context: int = 512
    ray: str | None = None  # --ray [ADDRESS]: (row, text) units as Ray tasks (ray_units.LOCAL: a local Ray)
    qdq_on_cpu: bool = False  # the quantized HTP rows' QDQ graphs on the CPU EP, not the simulator


def check(b: LmBench) -> None:
    """Refuse a bad flag before anything is exported (KzttsError naming the flag and the choices)."""
    if not b.weights or b.weights[0] != "fp32":
        raise KzttsError("--weights must start with fp32 (the reference row)")
    unknown = sorted(set(b.precisions) - set(HTP_PRECISIONS))
    if unknown:
        raise KzttsError(f"--htp-precisions: unknown {', '.join(unknown)} (expected {', '.join(HTP_PRECISIONS)})")
    unknown = sorted(p for p in set(b.placements) - set(PLACEMENTS) if not Path(p).is_file())
    if unknown:
        raise KzttsError(f"--placements: unknown {', '.join(unknown)} (expected {', '.join(PLACEMENTS)} or "
                         "placement files)")
    stems = [Path(p).stem for p in b.placements if p not in PLACEMENTS]
    if len(set(stems)) != len(stems) or set(stems) & set(PLACEMENTS):
        raise KzttsError(f"--placements: placement files name their rows: give files of distinct names "
                         f"({', '.join(stems)})")
    if b.texts:
        unknown = sorted(set(_names(b.texts)) - {s.name for s in SAMPLES})
        if unknown:
            raise KzttsError(f"--texts: unknown {', '.join(unknown)} (the set: {', '.join(s.name for s in SAMPLES)})")
    if not b.source.exists():
        raise KzttsError(f"{b.source}: no such checkpoint (a GGUF file or a Hugging Face directory)")
    if b.ray is not None and b.reference is not None:
        raise KzttsError("--reference: with --ray the fp32 row's units are kept in OUT/units and reused by a rerun "
                         "with the same --out; drop --reference")
    if b.qdq_on_cpu:
        if b.target is None:
            raise KzttsError("--qdq-on-cpu runs a target's quantized HTP graphs on the CPU EP: give --target")
        floats = [p for p in b.precisions if not G.htp_precision(p).quantized]
        if floats:
            raise KzttsError(f"--qdq-on-cpu: {', '.join(floats)} graphs have no QDQ nodes (the CPU EP would run "
                             f"them in fp32, not as the HTP does): give --htp-precisions "
                             f"{','.join(G.QUANTIZED_PRECISIONS)}")
    if b.ray is not None:
        ray_units.check_address(b.ray)


def _names(csv: str) -> list[str]:
    return [t.strip() for t in csv.split(",") if t.strip()]


def run(b: LmBench) -> list[dict]:
    """Every row, written to ``b.out`` as it finishes; returns the rows."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle
    check(b)
    if b.qdq_on_cpu:
        qnn.disable_for_this_process("--qdq-on-cpu")
    samples = tuple(s for s in SAMPLES if s.name in _names(b.texts)) if b.texts else SAMPLES
    steps = b.greedy_steps if b.greedy_steps is not None else GREEDY_STEPS
    b.out.mkdir(parents=True, exist_ok=True)
    bundle = b.bundle or cached_lm_bundle(b.source, target=b.target, segments=b.target is not None)
    manifest = read_manifest(bundle).data
    no_guarded, qbundles = {}, {}
    for prec in (p for p in b.precisions if b.target and G.htp_precision(p).quantized):
        no_guarded[prec] = quantized_guarded_refusal(b.source, b.target, prec)
        qbundles[prec] = (b.quantized_bundles or {}).get(prec) or cached_lm_bundle(b.source, target=b.target,
                                                                                   precision=prec)
    specs = row_specs(bundle, list(b.weights), b.target, list(b.placements), b.out, b.calibrate_prompts,
                      precisions=tuple(b.precisions), quantized_bundles=qbundles, guarded=b.guarded_placement,
                      qdq_on_cpu=b.qdq_on_cpu)
    done: list[dict] = []
    model = model_facts(manifest)
    bundles = {"bundle": {"name": Path(bundle).name, "digest": bundle_digest(bundle)},
               "quantized_bundles": {p: {"name": Path(q).name, "digest": bundle_digest(q)} for p, q in qbundles.items()}}
    command = portable_command(b.command)
    extra: dict = {}

    def write_json(complete: bool) -> None:
        (b.out / "lm_accuracy.json").write_text(json.dumps(
            {"model": model, **bundles, "code_version": ray_units.code_version("lm"), "threads": b.threads,
             "texts": [s.name for s in samples], "greedy_steps": steps, "no_guarded_row": no_guarded,
             "qdq_on_cpu": b.qdq_on_cpu,
             "load_avg_end": psutil.getloadavg(), "command": command, "complete": complete, "rows": done, **extra},
            indent=1, default=str), encoding="utf-8")

    def on_row(row: dict) -> None:
        log.info("row %s", json.dumps(row))
        done.append(row)
        write_json(complete=False)

    if b.ray is not None:
        rows, extra["ray"] = run_ray_units(b, specs, samples, steps)
        done.extend(rows)
    else:
        rows = run_rows(specs, samples=samples, threads=b.threads, steps=steps, context=b.context,
                        on_row=on_row, reference_file=b.reference)
    write_json(complete=True)
    md = report_markdown(rows, model, b.threads, b.texts, steps, no_guarded, command, b.qdq_on_cpu)
    (b.out / "lm_accuracy.md").write_text(md, encoding="utf-8")
    print(md)
    return rows


REFERENCE_KEYS = ("ref_tokens", "ref_greedy", "ref_logits")  # what the fp32 unit of a text gives the others


def _text_id(s: Sample) -> dict:
    return {"name": s.name, "sha256": hashlib.sha256((s.prompt + "\0" + s.text).encode()).hexdigest()[:16]}


def _row_id(spec: RowSpec) -> dict:
    """A row as a unit's key names it: its settings, its target's and placement file's bytes (not their paths)."""
    placement = spec.placement
    if placement is not None and Path(placement).is_file():
        placement = {"file": Path(placement).name, "sha256": ray_units.file_sha(placement)}
    target = None
    if spec.target is not None:
        path = load_target(spec.target).path
        target = {"name": path.stem, "sha256": ray_units.file_sha(path)}
    return {"name": spec.name, "weights": spec.weights, "device": spec.device, "target": target, "placement": placement,
            "check_saturation": spec.check_saturation, "strict": spec.strict, "guard_counts": spec.guard_counts}


def lm_units(b: LmBench, specs: list[RowSpec], samples, steps: int, limit: int) -> dict:
    """{(row index, text name): unit} of ``--ray``: each row over each text, after the fp32 row's unit of that
    text. CPU rows are timed (a whole node); HTP rows ask for ``b.threads`` CPUs; memory from their plans."""
    code = ray_units.code_version("lm")
    units: dict = {}
    for i, spec in enumerate(specs):
        mb, how = ray_units.plan_memory_mb(spec.bundle, ("talker_prefill", "talker_decode"), target=spec.target,
                                           placement=spec.placement, check_saturation=spec.check_saturation)
        timed = spec.device == "cpu"
        resources = ray_units.Resources(mb, how, cpus=None if timed else b.threads, whole_node=timed)
        files = {}
        if spec.target is not None:  # the driver's target file, whatever the node's qnn_configs hold
            files["target"] = load_target(spec.target).path
        if spec.placement is not None and Path(spec.placement).is_file():
            files["placement"] = Path(spec.placement)
        row_id = _row_id(spec)
        for s in samples:
            first = units.get((0, s.name))
            identity = {"bench": "lm", "row": row_id, "bundle": ray_units.bundle_id(spec.bundle), "text": _text_id(s),
                        "greedy_steps": steps, "context": limit, "threads": b.threads, "code": code,
                        "reference": None if i == 0 else first.key}
            tag = f"{re.sub(r'[^A-Za-z0-9]+', '-', spec.name)}_{s.name}"
            payload = {"module": "kztts.bench.ray_units", "tag": tag, "threads": b.threads,
                       "take": REFERENCE_KEYS if i else (),
                       "spec": {"row": ray_units.row_spec_json(spec), "text": s.name, "threads": b.threads,
                                "steps": steps, "limit": limit, "target": spec.target, "placement": spec.placement}}
            units[(i, s.name)] = ray_units.Unit(tag, f"{spec.name}, {s.name}", "lm", identity, "worker", payload,
                                                resources, files, [str(Path(spec.bundle).resolve())],
                                                after=None if i == 0 else first.key)
    return units


def run_ray_units(b: LmBench, specs: list[RowSpec], samples, steps: int) -> tuple[list[dict], dict]:
    """The rows of :func:`run` from (row, text) units run as Ray tasks (``--ray``); and the run's facts."""
    limit = context_limit(specs, b.context)
    units = lm_units(b, specs, samples, steps, limit)
    store = ray_units.UnitStore(b.out / "units")
    with ray_units.cluster(b.ray) as c:
        outcome = ray_units.run_units(list(units.values()), store, c, "bench --lm --ray")
        facts = outcome.to_json(c, store)
    results = {k: outcome.results[u.key] for k, u in units.items()}
    rows = rows_from_texts(specs, samples, results, steps)
    for i, row in enumerate(rows):
        row["nodes"] = {s.name: (results[(i, s.name)].get("node") or {}).get("id") for s in samples}
        row["units"] = {s.name: results[(i, s.name)].get("unit") for s in samples}
        log.info("row %s", json.dumps({k: v for k, v in row.items() if k != "per_sample"}))
    return rows, facts


UNKNOWN = "unknown"  # a fact a rebuilt report could not recover (its run directory was lost)


# the facts that say which model and bundles a run measured: a run that does not know one could have measured
# anything, so a merge takes it only when --allow-unknown names the fact
IDENTITY_FACTS = ("model", "bundle", "quantized_bundles")


def _has_unknown(v) -> bool:
    if isinstance(v, dict):
        return any(_has_unknown(x) for x in v.values())
    return v == UNKNOWN


def _agreed(runs: list[dict], dirs: list[Path], key: str, part=lambda v: v, allow_unknown: Iterable[str] = ()):
    """The one known value of ``part(run[key])`` over the runs; runs that know different values are refused,
    naming them. ``"unknown"`` values say nothing, and are refused for the :data:`IDENTITY_FACTS` unless
    ``allow_unknown`` names the fact."""
    known = {}
    for d, r in zip(dirs, runs):
        v = r.get(key, UNKNOWN)
        if v != UNKNOWN and v is not None:
            v = part(v)
        if key in IDENTITY_FACTS and key not in allow_unknown and _has_unknown(v):
            raise KzttsError(f"--merge: {d}: its report does not know its {key} (\"unknown\"), so nothing shows it "
                             f"measured what the other runs did; rerun it, or pass --allow-unknown {key} to merge "
                             "it on your word")
        if v != UNKNOWN:
            known.setdefault(json.dumps(v, sort_keys=True), []).append(str(d))
    if len(known) > 1:
        said = "; ".join(f"{v} in {', '.join(ds)}" for v, ds in sorted(known.items()))
        raise KzttsError(f"--merge: the runs differ in {key} ({said}); merge runs of one table")
    return json.loads(next(iter(known))) if known else UNKNOWN


def merge(dirs: list[Path], out: Path, command: str, allow_unknown: Iterable[str] = ()) -> list[dict]:
    """The table of runs over disjoint ``--texts`` (their ``lm_accuracy.json``), as one run over all their
    texts would give it (``kztts.eval.lm_accuracy.merge_rows``), written to ``out`` like a run's. A long row,
    such as the simulator's quantized all-htp at 1.5B (about a minute per decode step), can so be run one
    text at a time. Only the reports are read: runs of different models, bundles (by digest) or code
    (``code_version``: the rows' modules and packages) are refused, and so are runs that do not know their model
    or bundle digests unless ``allow_unknown`` names those facts (:data:`IDENTITY_FACTS`). ms/token is a median
    and is not merged (each shard's report keeps its own)."""
    bad = sorted(set(allow_unknown) - set(IDENTITY_FACTS))
    if bad:
        raise KzttsError(f"--allow-unknown {','.join(bad)}: expected some of {','.join(IDENTITY_FACTS)}")
    runs = []
    for d in dirs:
        f = Path(d) / "lm_accuracy.json"
        try:
            runs.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            raise KzttsError(f"{f}: not a finished bench_lm run's report ({e})") from e
    missing = [str(d) for d, r in zip(dirs, runs) if "model" not in r]
    if missing:
        raise KzttsError(f"--merge: {', '.join(missing)}: a report without `model` (written before reports "
                         "carried their model and bundle digests); rerun it")
    steps = _agreed(runs, dirs, "greedy_steps")
    model = _agreed(runs, dirs, "model", allow_unknown=allow_unknown)
    digests = {"bundle": _agreed(runs, dirs, "bundle", lambda v: v["digest"], allow_unknown),
               "quantized_bundles": _agreed(runs, dirs, "quantized_bundles",
                                            lambda v: {p: q["digest"] for p, q in v.items()}, allow_unknown)}
    code = _agreed(runs, dirs, "code_version")
    threads = _agreed(runs, dirs, "threads")
    qdq_on_cpu = _agreed(runs, dirs, "qdq_on_cpu") is True
    unfinished = [str(d) for d, r in zip(dirs, runs) if not r.get("complete")]
    if unfinished:
        raise KzttsError(f"--merge: {', '.join(unfinished)} did not finish (complete: false)")
    try:
        rows = merge_rows([r["rows"] for r in runs], steps)
    except ValueError as e:
        raise KzttsError(f"--merge: {e}") from e
    texts = [t for r in runs for t in r["texts"]]
    command = portable_command(command)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lm_accuracy.json").write_text(json.dumps(
        {"model": model, "bundle": {"digest": digests["bundle"]}, "quantized_bundles": digests["quantized_bundles"],
         "code_version": code, "threads": threads, "texts": texts, "greedy_steps": steps,
         "no_guarded_row": runs[0].get("no_guarded_row"), "qdq_on_cpu": qdq_on_cpu,
         "merged_from": [portable_path(Path(d).resolve()) for d in dirs], "command": command, "complete": True,
         "rows": rows}, indent=1), encoding="utf-8")
    md = report_markdown(rows, model if model != UNKNOWN else {}, threads, ",".join(texts), steps,
                         runs[0].get("no_guarded_row"), command, qdq_on_cpu)
    (out / "lm_accuracy.md").write_text(md, encoding="utf-8")
    print(md)
    return rows


def add_arguments(ap, standalone: bool) -> None:
    """The LM flags; ``standalone`` (bench_lm.py) adds the ones ``kztts bench`` already has."""
    g = ap.add_argument_group("LM rows (kztts.bench.lm)") if not standalone else ap
    if standalone:
        g.add_argument("--weights", default="fp32,int8,int4", help="CPU rows (fp32 first: the reference)")
        g.add_argument("--target", help="HTP simulator rows for this target (the bundle's static graphs)")
        g.add_argument("--threads", type=int, default=2)
        g.add_argument("--out", type=Path, required=True)
    g.add_argument("--lm-bundle", "--bundle", dest="lm_bundle", type=Path,
                   help="the LM's fp32 bundle (default: exported into the cache; with --target it must hold that "
                        "target's graphs and --segments)")
    g.add_argument("--placements", default=",".join(PLACEMENTS),
                   help="HTP rows' placements: modes, and placement files (each an fp16 row named after its file, "
                        "e.g. a per-layer sweep)")
    g.add_argument("--htp-precisions", default=",".join(HTP_PRECISIONS),
                   help=f"HTP rows: {G.FLOAT_HTP_PRECISION} (the --lm-bundle's graphs), "
                        f"{', '.join(G.QUANTIZED_PRECISIONS)} (a bundle each)")
    g.add_argument("--quantized-bundle", action="append", default=[], metavar="PRECISION=BUNDLE",
                   help="the LM bundle of a quantized precision's rows (repeatable; default: exported into the cache "
                        "with --target --precision PRECISION)")
    g.add_argument("--calibrate-prompts", type=Path, help="kztts calibrate's prompts for the guarded row "
                                                           "(default: the text set's prompts)")
    g.add_argument("--guarded-placement", type=Path, help="the guarded row's placement file (a `kztts calibrate` "
                                                           "output) instead of calibrating now")
    g.add_argument("--texts", help="a subset of the text set, by name (comma-separated; default: all; the "
                                   "report names them)")
    g.add_argument("--greedy-steps", type=int, default=None, help="greedy tokens per prompt (default: "
                                                                  "kztts.eval.lm_accuracy.GREEDY_STEPS)")
    g.add_argument("--reference", type=Path, help="an .npz for the fp32 row: read when it was saved for the same "
                                                 "bundle, texts, greedy steps and context, else computed and "
                                                 "saved (one HTP row per process without recomputing fp32)")
    g.add_argument("--lm-context", "--context", dest="lm_context", type=int, default=512,
                   help="CPU KV positions (texts are cut to it)")
    g.add_argument("--qdq-on-cpu", action="store_true",
                   help="the quantized HTP rows (--htp-precisions w8a16,w4a16) run their QDQ graphs on ONNX Runtime's "
                        "CPU EP instead of the simulator (rows named qdq-cpu): the HTP's quantization grid in "
                        "minutes where the simulator takes hours; needs --target")
    if standalone:
        add_ray_argument(g)


def add_ray_argument(ap) -> None:
    """``--ray [ADDRESS]`` (``kztts bench`` and ``bench_lm.py``)."""
    ap.add_argument("--ray", nargs="?", const=ray_units.LOCAL, default=None, metavar="ADDRESS",
                    help="run every row (LM: every row x text) as a Ray task, kept in OUT/units as it finishes, so a "
                         "rerun with the same --out runs only what is missing: alone, a local Ray with this machine's "
                         "CPUs; ADDRESS (e.g. auto, HOST:6379, ray://HOST:10001) joins a cluster whose nodes see the "
                         "bundles at the same paths (docs/CLUSTER.md). Needs the cluster extra (pip install "
                         "'kztts[cluster]')")


def _quantized_bundles(items: list[str]) -> dict[str, Path]:
    """``--quantized-bundle PRECISION=BUNDLE`` flags as {precision: bundle}; a bad one is refused naming it."""
    out = {}
    for item in items:
        prec, sep, path = item.partition("=")
        if not sep or prec not in G.QUANTIZED_PRECISIONS or not path:
            raise KzttsError(f"--quantized-bundle {item}: expected PRECISION=BUNDLE with PRECISION one of "
                             f"{', '.join(G.QUANTIZED_PRECISIONS)}")
        out[prec] = Path(path)
    return out


def from_args(args, source: Path, *, target: str | None, threads: int, out: Path, command: str) -> LmBench:
    """An :class:`LmBench` from parsed :func:`add_arguments` flags."""
    return LmBench(source=Path(source), out=Path(out), command=command, bundle=args.lm_bundle,
                   weights=tuple(_names(args.weights)), target=target, placements=tuple(_names(args.placements)),
                   precisions=tuple(_names(args.htp_precisions)),
                   quantized_bundles=_quantized_bundles(args.quantized_bundle),
                   calibrate_prompts=args.calibrate_prompts, guarded_placement=args.guarded_placement,
                   texts=args.texts, greedy_steps=args.greedy_steps, reference=args.reference, threads=threads,
                   context=args.lm_context, ray=getattr(args, "ray", None), qdq_on_cpu=args.qdq_on_cpu)


def main(argv: list[str] | None = None) -> int:
    """``benchmarks/lm_precision/bench_lm.py``: the same rows as ``kztts bench --lm``, with the LM's own flags."""
    import argparse
    import shlex
    import sys


    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path, help="a Qwen2/Qwen3 GGUF file")
    src.add_argument("--model", type=Path, help="a Qwen2/Qwen3 Hugging Face directory")
    src.add_argument("--merge", type=Path, nargs="+", metavar="DIR",
                     help="instead of running: merge the --out DIRs of runs over disjoint --texts into one table")
    ap.add_argument("--allow-unknown", default="", metavar="FACTS",
                    help=f"with --merge: take runs whose report does not know these facts (some of "
                         f"{','.join(IDENTITY_FACTS)}); refused otherwise")
    add_arguments(ap, standalone=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    command = " ".join(shlex.quote(a) for a in ["python", "benchmarks/lm_precision/bench_lm.py", *(argv or sys.argv[1:])])
    try:
        if args.merge:
            merge(args.merge, args.out, command, allow_unknown=_names(args.allow_unknown))
            return 0
        run(from_args(args, args.gguf or args.model, target=args.target, threads=args.threads, out=args.out,
                      command=command))
    except KzttsError as e:
        ap.error(str(e))
    return 0
