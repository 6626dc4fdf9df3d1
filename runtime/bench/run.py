"""A ``kztts bench`` run: speed against accuracy over a grid of configurations, with the qwen-tts reference.

Order of work (every step cached or written under the results folder):
1. the checkpoint (``model_dir``, or the random-weight ``size`` model from ``make_tiny``), its fp32
   bundle (``cached_bundle``) and the precision variants (``cached_variant``);
2. the x-vector of a fixed synthetic voice (kztts speaker encoder), shared by every row;
3. the baseline: the fp32 bundle, greedy, in its own process: codes G, teacher-forced logits,
   the audio of G; every row's accuracy is measured against it;
4. the reference, qwen-tts PyTorch, once per thread count;
5. every configuration in its own process (``kztts.bench.worker``; batched rows ``batch_worker``);
6. with HTP targets: per target and HTP precision, a bundle with the target's static graphs at a
   small context (``kztts.bench.htp``) and one row on the HTP simulator (``kztts.bench.htp_worker``):
   accuracy only, never timed, run once (not per round);
7. the end-to-end text -> WAV pair (``kztts.bench.e2e``) and, with ``quality``, sampled speech
   (``kztts.bench.quality_rows``); then the report (``kztts.bench.report``).
Workers run one at a time, never concurrently (2 cores); the load average is recorded.

With ``ray`` (``--ray [ADDRESS]``), steps 1-4 and 6's exports run here as above (the baseline is kept in
``OUT/units`` and reused by a rerun), and every row of 5-7 (one round of a timed row, an HTP row, the
end-to-end pair) is a unit of ``kztts.bench.ray_units``: a Ray task kept in ``OUT/units`` as it finishes.
Timed units each get a whole node and measure that node's bandwidth just before their row; the sampled
speech of ``quality`` runs here afterwards. The rows, tables, plot and JSON are those of a sequential run.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil

import kztts
from kztts.bench import batch_rows, ray_units, report
from kztts.bench import e2e as bench_e2e
from kztts.bench import grid as G
from kztts.bench import limits as bench_limits
from kztts.bench import quality_rows as Q
from kztts.bench.htp import bench_context, bench_target_file, cached_htp_bundle
from kztts.bundle import graphs
from kztts.bundle.bundle import Bundle
from kztts.bundle.manifest import random_weights_label, read_manifest
from kztts.core.atomic import check_writable_dir
from kztts.core.audio import synthetic_voice
from kztts.core.errors import KzttsError
from kztts.core.progress import Steps
from kztts.core.worker_process import WorkerError, run_worker
from kztts.runners.speaker import SpeakerEncoder

log = logging.getLogger(__name__)

DEFAULT_TEXT = "Bonjour je m'appelle Kazeia"  # the earlier C++ port's sentence: 19 prompt positions
DEFAULT_LANGUAGE = "french"
_TIMED = ("prefill_ms", "talker_ms", "cp_ms", "decoder_ms", "frame_ms", "frame_rtf", "rtf", "ttfa_ms", "ttfa_p50_ms",
          "ttfa_p95_ms", "wall_s",
          "fps", "fps_talker_cp", "fps_wall")


@dataclass
class BenchOptions:
    """What a bench run measures: the flags of ``kztts bench`` (one name each, as on the command line)."""

    size: str = "tiny"
    model_dir: str | None = None
    weights: str = ",".join(graphs.CPU_WEIGHT_PRECISIONS)
    kv: str = ",".join(graphs.KV_PRECISIONS)
    cp_mode: str = ",".join(graphs.CP_MODES)
    decoder: str = "fp32"
    threads: str = "1,2"
    spin: str = "0"
    pipeline: str = "0"
    attention: str = "fused"
    frames: int = 24
    warmup: int = 4
    chunk: int = 4
    rounds: int = 1
    batch: str | None = None
    e2e_runs: int = 3
    text: str = DEFAULT_TEXT
    language: str = DEFAULT_LANGUAGE
    target: str = "cpu"
    htp_precision: str = graphs.HTP_PRECISIONS[0]
    htp_context: int = 0
    htp_dir: str | None = None
    no_reference: bool = False
    quality: bool = False
    seeds: int = 5
    out: str | None = None
    ray: str | None = None  # --ray [ADDRESS]: rows as Ray tasks (kztts.bench.ray_units.LOCAL: a local Ray)

    @classmethod
    def from_args(cls, args) -> "BenchOptions":
        return cls(**{f.name: getattr(args, f.name, f.default) for f in fields(cls)})

    def command(self) -> str:
        """The command line that repeats this run (printed in the report)."""
        source = f"--model-dir {self.model_dir}" if self.model_dir else f"--size {self.size}"
        return (f"kztts bench {source} --weights {self.weights} --kv {self.kv} --cp-mode {self.cp_mode} "
                f"--decoder {self.decoder} --threads {self.threads} --spin {self.spin} --frames {self.frames} "
                f"--warmup {self.warmup} --chunk {self.chunk} --rounds {self.rounds}"
                f"{' --no-reference' if self.no_reference else ''} --target {self.target} "
                f"--htp-precision {self.htp_precision} --htp-context {self.htp_context}"
                f"{f' --quality --seeds {self.seeds}' if self.quality else ''}"
                f"{f' --batch {self.batch}' if self.batch else ''} --e2e-runs {self.e2e_runs}"
                f"{_ray_flag(self.ray)}")


def _ray_flag(address: str | None) -> str:
    if address is None:
        return ""
    return " --ray" if address == ray_units.LOCAL else f" --ray {address}"


@dataclass
class Grid:
    """The rows a run will measure, checked before any work."""

    configs: list  # kztts.bench.grid.Config: timed CPU rows
    batches: list[int]
    htp_configs: list  # kztts.bench.grid.HtpConfig: untimed simulator rows
    out: Path

    @property
    def threads_max(self) -> int:
        return max(c.threads for c in self.configs) if self.configs else 0


@dataclass
class Prepared:
    """The bundles and inputs every row shares."""

    model_dir: Path
    base: Path  # the fp32 bundle
    bundles: dict  # {(weights, kv, decoder): bundle}
    xvector: Path
    work: Path
    common: dict  # the spec keys every worker gets
    baseline: Path = field(default=Path())  # the fp32 run's codes, logits and audio
    baseline_row: dict = field(default_factory=dict)


def default_out() -> Path:
    """``benchmarks/results/bench-<time>`` in a source tree, else ``kztts-bench-results/bench-<time>``."""
    repo = Path(kztts.__file__).resolve().parents[1] / "benchmarks"
    root = repo / "results" if repo.is_dir() else Path("kztts-bench-results")
    return root / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"


def run_row(module: str, spec: dict, work: Path, tag: str, threads: int) -> dict:
    """Run ``python -m module SPEC`` and return its JSON row (an ``error`` row if it failed)."""
    load = psutil.getloadavg()[0]
    try:
        row = run_worker(module, spec, work, tag, env={"OMP_NUM_THREADS": str(threads), "KZTTS_THREADS": str(threads)})
    except WorkerError as e:
        log.error("%s failed: %s", tag, e.brief())
        return {"error": e.brief()[-400:], "load_avg_before": load}
    row["load_avg_before"], row["load_avg_after"] = round(load, 2), round(psutil.getloadavg()[0], 2)
    return row


def merge_rounds(rows: list[dict]) -> dict:
    """One row from a configuration's rounds: timings = median over rounds of each round's
    median, peak RSS = the largest, accuracy from the first round (it is deterministic)."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return rows[0]
    out = dict(ok[0])
    for k in _TIMED:
        vals = [r[k] for r in ok if r.get(k) is not None]
        out[k] = round(statistics.median(vals), 4) if vals else None
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in ok)
    out["rounds"] = len(ok)
    out["rounds_ms"] = {k: [r.get(k) for r in ok] for k in ("talker_ms", "cp_ms", "decoder_ms", "frame_ms")}
    out["load_avg_before"] = [r.get("load_avg_before") for r in ok]
    out["load_avg_after"] = [r.get("load_avg_after") for r in ok]
    return out


def check(o: BenchOptions) -> Grid:
    """The grid of ``o``, every flag checked (a bad one is a KzttsError before any work)."""
    out = check_writable_dir(o.out, "results folder", create_parents=True) if o.out else default_out()
    with_cpu, htp_targets = G.parse_targets(o.target)
    configs = G.grid(G.parse_list(o.weights, "weights"), G.parse_list(o.kv, "kv"),
                     G.parse_list(o.cp_mode, "cp_mode"), G.parse_list(o.decoder, "decoder"),
                     G.parse_threads(o.threads), G.parse_spin(o.spin), G.parse_list(o.attention, "attention"),
                     G.parse_spin(o.pipeline, "--pipeline")) if with_cpu else []
    batches = batch_rows.parse_batches(o.batch)
    htp_configs = G.htp_grid(htp_targets, G.parse_htp_precisions(o.htp_precision), o.htp_context)
    if o.htp_context and o.htp_context < 2:
        raise KzttsError("--htp-context must be >= 2 (0: the prompt + frames, at least 64)")
    if o.frames < 2 or o.warmup < 0 or o.frames <= o.warmup or o.chunk < 1:
        raise KzttsError("need --frames >= 2, more frames than --warmup, and --chunk >= 1")
    if o.rounds < 1:
        raise KzttsError("--rounds must be >= 1")
    if htp_configs and importlib.util.find_spec("onnxruntime_qnn") is None:
        raise KzttsError(f"--target {o.target}: the HTP rows run on onnxruntime-qnn's HTP simulator, which is "
                         "not installed: pip install 'kztts[qnn]'")
    if o.quality and o.seeds < 1:
        raise KzttsError(f"--seeds {o.seeds}: --quality needs at least one seed")
    if o.ray is not None:
        ray_units.check_address(o.ray)
    if importlib.util.find_spec("torch") is None:
        raise KzttsError("kztts bench needs the export extra (torch, qwen-tts) for the model, the export and the "
                         "reference: pip install -e '.[export,bench]' && pip install --no-deps qwen-tts==0.1.1")
    return Grid(configs, batches, htp_configs, out)


def prepare(o: BenchOptions, grid: Grid, steps: Steps) -> Prepared:
    """The checkpoint, its fp32 bundle and variants, the shared x-vector, and the fp32 baseline run."""
    # the export extra (torch) is optional for kztts: loaded once check() found it
    from kztts.export.tts.bundle_writer import cached_bundle
    from kztts.export.tts.tiny import cached_tiny
    from kztts.export.common.variants import cached_variant

    steps.phase("model + fp32 bundle")
    model_dir = Path(o.model_dir) if o.model_dir else cached_tiny(
        variant="equal" if o.size == "tiny" else None, size=o.size)
    base = cached_bundle(model_dir)
    steps.update()
    steps.phase("precision variants")
    bundles = {}
    for c in grid.configs:
        key = (c.weights, c.kv, c.decoder)
        if key not in bundles:
            bundles[key] = cached_variant(base, weights=c.weights, kv=c.kv, decoder=c.decoder)
    steps.update()

    steps.phase("x-vector")
    work = grid.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    xvector = work / "xvector.npy"
    np.save(xvector, SpeakerEncoder.from_bundle(Bundle.open(base, load_graphs=False)).xvector(synthetic_voice(), 24000))
    common = {"text": o.text, "language": o.language, "xvector": str(xvector), "frames": o.frames,
              "warmup": o.warmup, "chunk": o.chunk}
    steps.update()

    steps.phase("fp32 baseline")
    p = Prepared(model_dir, base, bundles, xvector, work, common, work / "baseline.npz")
    threads = grid.threads_max or max(G.parse_threads(o.threads))
    kept = _kept_baseline(o, grid, p, threads)
    if kept is not None:
        p.baseline, p.baseline_row = kept
    else:
        p.baseline_row = run_row("kztts.bench.worker", {**common, "bundle": str(base), "cp_mode": "frame",
                                                        "threads": threads, "save_baseline": str(p.baseline)},
                                 work, "baseline", threads)
        if "error" in p.baseline_row:
            raise KzttsError(f"the fp32 baseline run failed: {p.baseline_row['error']}")
        _keep_baseline(o, grid, p, threads)
    steps.update()
    return p


def _baseline_unit(o: BenchOptions, grid: Grid, p: Prepared, threads: int) -> ray_units.Unit:
    """The fp32 baseline as a kept unit of ``--ray`` (run here, first: every row is measured against it)."""
    identity = {"bench": "tts", "kind": "baseline", "bundle": ray_units.bundle_id(p.base), "threads": threads,
                "xvector": ray_units.arrays_sha(p.xvector), "settings": _settings(o),
                "code": ray_units.code_version("tts")}
    return ray_units.Unit("baseline", "fp32 baseline", "tts", identity, "worker", {},
                          ray_units.Resources(0, "run by the driver"))


def _kept_baseline(o: BenchOptions, grid: Grid, p: Prepared, threads: int) -> tuple[Path, dict] | None:
    """Under ``--ray``, the baseline an earlier run of this ``--out`` kept: (its arrays' file, its row)."""
    if o.ray is None:
        return None
    unit = _baseline_unit(o, grid, p, threads)
    store = ray_units.UnitStore(grid.out / "units")
    kept = store.load(unit)
    if kept is None:
        return None
    arrays = {k: kept.pop(k) for k in [k for k, v in kept.items() if isinstance(v, np.ndarray)]}
    np.savez(p.baseline, **arrays)
    log.info("the fp32 baseline kept in %s is reused", store.root)
    return p.baseline, kept


def _keep_baseline(o: BenchOptions, grid: Grid, p: Prepared, threads: int) -> None:
    if o.ray is None:
        return
    with np.load(p.baseline) as z:
        arrays = {k: z[k] for k in z.files}
    ray_units.UnitStore(grid.out / "units").save(_baseline_unit(o, grid, p, threads), {**p.baseline_row, **arrays})


def htp_bundles(o: BenchOptions, htp_configs: list, p: Prepared, steps: Steps) -> dict:
    """{HtpConfig with its context: (HTP bundle, target file)}: the target at the row's static
    context (``htp_context``, or the baseline's prompt + frames, at least 64) and its export."""
    out = {}
    for h in htp_configs:
        context = h.context or bench_context(p.baseline_row["prefill_positions"], o.frames)
        h = replace(h, context=context)
        steps.phase(f"{h.name}: {h.precision} HTP graphs at context {context}")
        target_file = bench_target_file(h.target, context, p.work / "targets")
        out[h] = (cached_htp_bundle(p.base, p.model_dir, target_file, h.precision, o.htp_dir), target_file)
        steps.update()
    return out


def _tasks(o: BenchOptions, grid: Grid) -> list:
    tasks: list = [] if o.no_reference else [("reference", t) for t in sorted({c.threads for c in grid.configs})]
    tasks += [("kztts", c) for c in grid.configs]
    return tasks + batch_rows.batch_tasks(grid.configs, grid.batches)


def _row_call(o: BenchOptions, p: Prepared, kind: str, what, rnd: int, threads_max: int,
              htp: dict) -> tuple[str, dict, str, int]:
    """A row's worker: (module, spec, tag, threads) of one round of it."""
    base_spec = {**p.common, "baseline": str(p.baseline)}
    if kind == "htp":
        bundle, target = htp[what]
        return ("kztts.bench.htp_worker", {**base_spec, "bundle": str(bundle), "target": str(target),
                                           "threads": threads_max}, what.slug, threads_max)
    if kind == "batch":
        c, n = what
        return (batch_rows.WORKER, batch_rows.spec(p.common, p.bundles[(c.weights, c.kv, c.decoder)], c, n, p.baseline),
                batch_rows.tag(c, n, rnd), c.threads)
    if kind == "reference":
        return ("kztts.export.tts.bench_reference", {**base_spec, "model_dir": str(p.model_dir), "threads": what},
                f"reference_t{what}_r{rnd}", what)
    return ("kztts.bench.worker", {**base_spec, "bundle": str(p.bundles[(what.weights, what.kv, what.decoder)]),
                                   "cp_mode": what.cp_mode, "threads": what.threads, "spin": what.spin,
                                   "attention": what.attention, "pipeline": what.pipeline},
            f"{what.slug}_r{rnd}", what.threads)


def _run_task(o: BenchOptions, p: Prepared, kind: str, what, rnd: int, threads_max: int, htp: dict) -> dict:
    """One row's run (one round of it)."""
    module, spec, tag, threads = _row_call(o, p, kind, what, rnd, threads_max, htp)
    return run_row(module, spec, p.work, tag, threads)


def _label(kind: str, what, rnd: int, rounds: int) -> str:
    if kind == "htp":
        return f"{what.name} on the HTP simulator (untimed)"
    suffix = f"(round {rnd + 1}/{rounds})"
    if kind == "batch":
        return f"{what[0].name} batch {what[1]} {suffix}"
    if kind == "reference":
        return f"qwen-tts reference, {what} threads {suffix}"
    return f"{what.name} {suffix}"


def run_tasks(o: BenchOptions, grid: Grid, p: Prepared, htp: dict, steps: Steps) -> dict:
    """{task: its rounds' rows}. Every round rotates the order, so a load burst on a shared machine
    does not always hit the same configurations; the HTP rows run once, in the first round."""
    tasks = _tasks(o, grid)
    runs: dict = {task: [] for task in tasks}
    threads_max = grid.threads_max or max(G.parse_threads(o.threads))
    for rnd in range(o.rounds):
        k = rnd % len(tasks) if tasks else 0
        for kind, what in tasks[k:] + tasks[:k] + ([("htp", h) for h in htp] if rnd == 0 else []):
            steps.phase(_label(kind, what, rnd, o.rounds))
            runs.setdefault((kind, what), []).append(_run_task(o, p, kind, what, rnd, threads_max, htp))
            steps.update()
    return runs


TTS_ROLES = ("talker_prefill", "talker_decode", "code_predictor", "decoder")  # what a row's worker opens


def _settings(o: BenchOptions) -> dict:
    return {"text": o.text, "language": o.language, "frames": o.frames, "warmup": o.warmup, "chunk": o.chunk}


def _model_id(p: Prepared) -> dict:
    """The checkpoint as a key names it: the sha256 its fp32 bundle's manifest records."""
    return {"name": Path(p.model_dir).name, "sha256": (read_manifest(p.base).data.get("source") or {}).get("sha256")}


def _row_unit(o: BenchOptions, p: Prepared, kind: str, what, rnd: int, threads_max: int, htp: dict,
              common: dict) -> ray_units.Unit:
    """One round of a row as a unit of ``--ray``: its worker, key, resources and the files it needs."""
    module, spec, tag, threads = _row_call(o, p, kind, what, rnd, threads_max, htp)
    files = {"xvector": p.xvector, "baseline": p.baseline}
    identity = {**common, "kind": kind}
    if kind == "htp":
        bundle, target = htp[what]
        files["target"] = target
        mb, how = ray_units.plan_memory_mb(bundle, TTS_ROLES, target=target)
        identity.update(what=what.as_dict(), bundle=ray_units.bundle_id(bundle), target=ray_units.file_sha(target),
                        threads=threads)
        shared = [str(bundle)]
    elif kind == "reference":
        mb, how = ray_units.checkpoint_memory_mb(p.model_dir)
        identity.update(threads=what, round=rnd, model=_model_id(p))
        shared = [str(p.model_dir)]
    else:
        c, batch = (what, None) if kind == "kztts" else what
        bundle = p.bundles[(c.weights, c.kv, c.decoder)]
        mb, how = ray_units.plan_memory_mb(bundle, TTS_ROLES, cp_mode=c.cp_mode, attention=c.attention)
        identity.update(what=c.as_dict(), batch=batch, round=rnd, bundle=ray_units.bundle_id(bundle))
        shared = [str(bundle)]
    timed = kind != "htp"
    if timed:
        mb, how = mb + ray_units.PROBE_MB, how + f" + {ray_units.PROBE_MB} MB of bandwidth probe"
    payload = {"module": module, "spec": spec, "tag": tag, "threads": threads, "probe": timed, "load": True}
    resources = ray_units.Resources(mb, how, cpus=None if timed else threads, whole_node=timed)
    return ray_units.Unit(tag, _label(kind, what, rnd, o.rounds), "tts", identity, "worker", payload, resources,
                          files, shared)


def _e2e_unit(o: BenchOptions, p: Prepared, common: dict) -> ray_units.Unit:
    """The end-to-end pair as a unit (timed: a whole node; both sides' processes at once)."""
    mb_k, how_k = ray_units.plan_memory_mb(p.base, TTS_ROLES)
    mb_r, how_r = ray_units.checkpoint_memory_mb(p.model_dir)
    identity = {**common, "kind": "e2e", "runs": o.e2e_runs, "threads": o.threads,
                "bundle": ray_units.bundle_id(p.base), "model": _model_id(p)}
    payload = {"options": o, "model_dir": str(p.model_dir), "bundle": str(p.base)}
    return ray_units.Unit("e2e", "end-to-end text -> WAV pair", "tts", identity, "e2e", payload,
                          ray_units.Resources(mb_k + mb_r, f"kztts side: {how_k}; qwen-tts side: {how_r}",
                                              cpus=None, whole_node=True),
                          {"xvector": p.xvector}, [str(p.base), str(p.model_dir)])


def run_ray_units(o: BenchOptions, grid: Grid, p: Prepared, htp: dict,
                  with_e2e: bool) -> tuple[dict, dict | None, dict]:
    """Every row of the grid (each round of a timed row, the HTP rows, the end-to-end pair) as Ray units:
    ``(runs, e2e, facts)``, ``runs`` as :func:`run_tasks` gives them, ``facts`` the cluster and the units."""
    threads_max = grid.threads_max or max(G.parse_threads(o.threads))
    common = {"bench": "tts", "baseline": ray_units.arrays_sha(p.baseline), "xvector": ray_units.arrays_sha(p.xvector),
              "settings": _settings(o), "code": ray_units.code_version("tts")}
    units: dict = {}
    for rnd in range(o.rounds):
        for kind, what in _tasks(o, grid):
            units[(kind, what, rnd)] = _row_unit(o, p, kind, what, rnd, threads_max, htp, common)
    for h in htp:
        units[("htp", h, 0)] = _row_unit(o, p, "htp", h, 0, threads_max, htp, common)
    if with_e2e:
        units[("e2e", None, 0)] = _e2e_unit(o, p, common)
    store = ray_units.UnitStore(grid.out / "units")
    baseline = _baseline_unit(o, grid, p, threads_max).key
    with ray_units.cluster(o.ray) as c:
        outcome = ray_units.run_units(list(units.values()), store, c, "bench --ray", known=[baseline])
        facts = outcome.to_json(c, store)
    runs: dict = {}
    e2e = None
    for (kind, what, rnd), u in units.items():
        result = dict(outcome.results[u.key])
        if kind == "e2e":
            e2e = None if result.get("error") else result
            if e2e is None:
                facts["e2e_error"] = result["error"]
            continue
        runs.setdefault((kind, what), []).append(result)
    return runs, e2e, facts


def _annotate_per_node(rows: list[dict], p: Prepared, o: BenchOptions) -> list:
    """``--ray``: each timed row's "% of limit" against the bandwidth its own node measured before it; the
    probes, for the header."""
    probes = []
    for r in rows:
        probe = r.get("bandwidth_probe") if r.get("threads") else None
        mine = [{int(r["threads"]): probe}] if probe else []
        probes += mine
        bench_limits.annotate([r], mine, p.base, p.bundles, o)
    return probes


def collect_rows(grid: Grid, runs: dict) -> list[dict]:
    """The table's rows: the reference per thread count, every configuration with its speed-up against
    the reference at its thread count, the batched rows, then the (untimed) HTP rows."""
    rows: list[dict] = []
    refs: dict[int, dict] = {}
    for (kind, what), rounds in runs.items():
        if kind == "reference":
            r = merge_rounds(rounds)
            r.update(kind="reference", name=f"qwen-tts PyTorch fp32/t{what}", threads=what, weights="fp32")
            refs[what] = r
            rows.append(r)
    for c in grid.configs:
        r = merge_rounds(runs[("kztts", c)])
        r.update(kind="kztts", **c.as_dict())
        ref = refs.get(c.threads)
        if ref and "error" not in ref and "error" not in r:
            r["speedup"] = round(ref["frame_ms"] / r["frame_ms"], 3)
            r["speedup_talker_cp"] = round((ref["talker_ms"] + ref["cp_ms"]) / (r["talker_ms"] + r["cp_ms"]), 3)
        rows.append(r)
    rows += [batch_rows.finish(merge_rounds(rounds), *what) for (kind, what), rounds in runs.items() if kind == "batch"]
    return rows


def _htp_rows(runs: dict, htp: dict) -> list[dict]:
    rows = []
    for h in htp:
        r = runs[("htp", h)][0]
        r.update(kind="htp-sim", timed=False, **h.as_dict())
        rows.append(r)
    return rows


def _sample_quality(o: BenchOptions, grid: Grid, p: Prepared, rows: list[dict], random_weights, steps: Steps) -> dict:
    """Sampled speech of every configuration (the fp32 CPU row, against which the others are flagged,
    even when only HTP rows are asked), its columns attached to ``rows``."""
    threads = grid.threads_max or max(G.parse_threads(o.threads))
    q_configs = grid.configs or [G.Config(threads=threads)]
    p.bundles.setdefault(("fp32", "fp32", "fp32"), p.base)
    q_context = Q.quality_context(p.base)
    q_htp = htp_bundles(o, [replace(h, context=max(h.context, q_context)) for h in grid.htp_configs], p, steps)
    sampled = Q.run_quality(q_configs, p.bundles, p.xvector, grid.out, o.seeds, random_weights=bool(random_weights),
                            htp=q_htp)
    Q.attach(rows, sampled["rows"])
    return sampled


def header(o: BenchOptions, p: Prepared, rows: list[dict], probes: list, random_weights, with_htp: bool) -> str:
    """The report's header: model, frames, host and load, what accuracy and speed-up mean."""
    load = psutil.getloadavg()
    size = o.size if not o.model_dir else Path(o.model_dir).name
    text = (f"kztts bench, model {size} ({Path(p.model_dir).name}), {o.frames} frames (EOS blocked), "
            f"medians after {o.warmup} warm-up frames, decoder chunk {o.chunk} frames, "
            f"{report.cpu_name()} ({report.cpu_isa()}), {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
            f"accuracy against the fp32 CPU bundle (greedy codes, teacher-forced logits, audio of its codes); "
            f"speed-up = qwen-tts PyTorch frame ms / row frame ms at the same threads")
    if random_weights:
        text += f"\nRANDOM weights ({random_weights_label(random_weights)}): speed and agreement are real, audio is not speech"
    text += bench_limits.probe_note(probes) + bench_limits.header_note(rows)
    return text + ("\n" + report.HTP_NOTE if with_htp else "")


def run_bench(o: BenchOptions) -> dict:
    """Every row of ``o`` (module docstring), written to ``o.out``; returns ``{"rows", "paths"}``."""
    grid = check(o)
    tasks = _tasks(o, grid)
    row_steps = 0 if o.ray is not None else len(tasks) * o.rounds + len(grid.htp_configs)
    steps = Steps(4 + row_steps + (1 + o.quality) * len(grid.htp_configs), "bench")
    p = prepare(o, grid, steps)
    htp = htp_bundles(o, grid.htp_configs, p, steps)
    with_e2e = o.e2e_runs > 0 and grid.configs and not o.no_reference  # the row compares with the reference
    ray_facts = None
    if o.ray is not None:
        runs, e2e, ray_facts = run_ray_units(o, grid, p, htp, bool(with_e2e))
        rows = collect_rows(grid, runs)
        probes = _annotate_per_node(rows, p, o)
    else:
        thread_counts = sorted({c.threads for c in grid.configs})
        probes = [bench_limits.probe_threads(thread_counts)]  # the host's streaming bandwidth, again after the rows
        runs = run_tasks(o, grid, p, htp, steps)
        rows = collect_rows(grid, runs)
        probes.append(bench_limits.probe_threads(thread_counts))
        e2e = bench_e2e.run_pair(o, p.model_dir, p.base, p.xvector, p.work) if with_e2e else None
        bench_limits.annotate(rows, probes, p.base, p.bundles, o)
    rows += _htp_rows(runs, htp)
    random_weights = Bundle.open(p.base, load_graphs=False).manifest.random_weights
    sampled = _sample_quality(o, grid, p, rows, random_weights, steps) if o.quality else None
    steps.close()

    head = header(o, p, rows, probes, random_weights, bool(htp))
    if ray_facts is not None:
        head += (f"\n--ray: every row a Ray task on {len(ray_facts['nodes'])} node(s) ({len(ray_facts['reused'])} of "
                 f"{ray_facts['units']} kept from an earlier run); a timed row had its node to itself, its % of "
                 "limit against the bandwidth that node measured just before it")
    meta = {"header": head, "command": o.command(), "model_dir": str(p.model_dir), "base_bundle": str(p.base),
            "load_average_end": psutil.getloadavg(), "cpu": report.cpu_name(), "cpu_isa": report.cpu_isa(), "cpu_count": os.cpu_count(),
            "versions": {"onnxruntime": ort.__version__, "numpy": np.__version__, "python": platform.python_version()},
            "text": o.text, "language": o.language, "frames": o.frames, "warmup": o.warmup, "chunk": o.chunk,
            "bandwidth_probes": probes, "e2e": e2e}
    if htp:
        meta["htp_rows_untimed"] = report.HTP_NOTE
    if ray_facts is not None:
        meta["ray"] = ray_facts
    extra = "\n" + bench_e2e.markdown(e2e) if e2e else ""
    paths = report.write_all(rows, meta, grid.out, extra)
    print(report.markdown(rows, head) + extra)
    if sampled:
        print("\n" + sampled["table"])
        paths.update(quality=sampled["dir"] / "quality.md", quality_index=sampled["dir"] / "index.md")
    for kind, path in paths.items():
        print(f"{kind}: {path}", file=sys.stderr)
    return {"rows": rows, "paths": paths}
