"""Accuracy of an LM bundle's precisions and placements against its fp32 CPU bundle.

numpy + onnxruntime only: the reference is the **fp32 CPU bundle** itself (``kztts.lm.lm.LM`` on the
CPU graphs), which ``kztts validate`` and ``tests/lm/test_lm.py`` check against transformers. Each
row (a bundle variant, a target and a placement) runs over :data:`SAMPLES`, a fixed multilingual
text set (code, English, French, Chinese):

- teacher forced: each text's prompt is prefilled, the rest fed one token at a time (decode
  steps); the logits at every predicted position against the reference's: cosine (mean, min) and
  top-1 agreement, and the text's perplexity under the row;
- greedy continuation: :data:`GREEDY_STEPS` argmax tokens (no repetition penalty, no stop id)
  after each prompt, against the reference's: tokens equal before the first divergence;
- CPU rows: median ms per decode step (at the session's threads) and the load average beside it
  (speed figures on a shared machine are noisy: compare rows of one run).

Texts are cut to the smallest context of the rows (the HTP graphs' static context), so every
row sees the same tokens. ``benchmarks/lm_precision/bench_lm.py`` builds the rows and writes the table.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import psutil

from kztts.bundle.sessions import SessionConfig
from kztts.core.cache import portable_path
from kztts.core.metrics import cosine_rows, median_ms, peak_rss_mb
from kztts.generation.sampling import SamplingParams
from kztts.htp.targets import load_target
from kztts.lm.lm import LM, Reply

log = logging.getLogger(__name__)

GREEDY_STEPS = 32
DEFAULT_CONTEXT = 512  # CPU KV positions: a 1.5B's 32k-position cache would take GBs


@dataclass(frozen=True)
class Sample:
    """One text of the set: ``prompt`` is prefilled (and continued greedily), ``text`` starts with it."""

    name: str
    prompt: str
    text: str


def _sample(name: str, prompt: str, rest: str) -> Sample:
    return Sample(name, prompt, prompt + rest)


SAMPLES: tuple[Sample, ...] = (
    _sample("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
            "def is_prime(n):\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n"
            "        if n % d == 0:\n            return False\n    return True\n"),
    _sample("english", "The history of the printing press begins in the fifteenth century, when",
            " Johannes Gutenberg combined movable metal type, oil-based ink and a wooden press adapted from "
            "those used to make wine. Books became cheaper and far more common, and within fifty years "
            "printing shops had spread to more than two hundred cities across Europe."),
    _sample("french", "La cuisine française est célèbre dans le monde entier, et",
            " chaque région possède ses propres spécialités : la bouillabaisse à Marseille, la choucroute en "
            "Alsace, les crêpes en Bretagne. Le repas reste un moment important de la journée, que l'on "
            "partage volontiers en famille ou entre amis."),
    _sample("chinese", "长城是中国古代的军事防御工程，",
            "东起山海关，西至嘉峪关，全长两万多公里。它修建于两千多年前，历经多个朝代的扩建和维修。"
            "今天，长城已经成为世界文化遗产，每年吸引数百万游客前来参观。"),
)


@dataclass(frozen=True)
class RowSpec:
    """One configuration: ``bundle`` (the fp32 bundle or a ``--weights`` variant) run on the CPU, or on
    ``target`` under ``placement`` (a mode or a placement file); ``check_saturation``: the fp16 guard."""

    name: str
    bundle: Path
    weights: str = "fp32"
    target: str | None = None
    placement: str | None = None
    check_saturation: bool = False
    strict: bool = True
    guard_counts: bool = False  # the guard counts flagged HTP calls (``guard_flagged``) instead of failing the row

    @property
    def device(self) -> str:
        return "cpu" if self.target is None else "htp"


@dataclass
class Tokens:
    """A sample's ids as every row sees them: ``prefill`` ids, then ``rest`` teacher-forced, and the
    greedy ``prompt`` (cut so that it and the greedy steps fit the context)."""

    name: str
    prefill: list[int]
    rest: list[int]
    prompt: list[int]


def tokenize(lm, samples: Sequence[Sample], context: int, steps: int = GREEDY_STEPS) -> list[Tokens]:
    """Each sample's ids cut to ``context`` positions (the greedy prompt to ``context - steps``)."""
    if context <= steps + 1:
        raise ValueError(f"context {context} too small for {steps} greedy steps")
    out = []
    for s in samples:
        ids = lm.encode(s.text)[:context]
        p = min(len(lm.encode(s.prompt)), len(ids) - 1)
        out.append(Tokens(s.name, ids[:p], ids[p:], lm.encode(s.prompt)[:context - steps]))
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def teacher_forced(lm, toks: Tokens) -> tuple[np.ndarray, list[float]]:
    """Logits [len(rest), vocab] predicting ``toks.rest`` and each decode step's seconds."""
    lm._claim(object())  # a fresh cache (the LM's one conversation)
    logits = [lm.feed(toks.prefill)]
    seconds = []
    for t in toks.rest[:-1]:
        t0 = time.perf_counter()
        logits.append(lm.feed([t]))
        seconds.append(time.perf_counter() - t0)
    return np.stack(logits), seconds


def greedy(lm, toks: Tokens, steps: int = GREEDY_STEPS) -> list[int]:
    """``steps`` argmax tokens after the prompt (no repetition penalty, stop ids ignored)."""
    lm._claim(object())
    stop, lm.stop_ids = lm.stop_ids, frozenset()
    try:
        reply = Reply()
        list(lm.tokens(lm.feed(toks.prompt), steps, SamplingParams.greedy_params(), 0, reply))
    finally:
        lm.stop_ids = stop
    return reply.ids


def perplexity(logits: np.ndarray, targets: Sequence[int]) -> float:
    """exp of the mean negative log-likelihood of ``targets`` under ``logits``."""
    lp = _log_softmax(logits)
    return float(math.exp(-lp[np.arange(len(targets)), np.asarray(targets)].mean()))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Reference:
    """The fp32 CPU bundle's logits and greedy tokens per sample."""

    logits: list[np.ndarray]
    greedy: list[list[int]]


def measure_texts(lm, tokens: Sequence[Tokens], reference: Reference | None,
                  steps: int = GREEDY_STEPS) -> tuple[dict[str, dict], list[list[float]], Reference]:
    """Each text's sums (``per_sample``, against ``reference``; None: this row is the reference), each text's
    decode-step seconds, and the reference (``reference``, or this row's own logits and greedy ids)."""
    logits, greedy_ids, secs = [], [], []
    per: dict[str, dict] = {}
    for i, toks in enumerate(tokens):
        lg, s = teacher_forced(lm, toks)
        secs.append(s)
        g = greedy(lm, toks, steps)
        if reference is None:
            logits.append(lg)
            greedy_ids.append(g)
            ref_lg, ref_g = lg, g
        else:
            ref_lg, ref_g = reference.logits[i], reference.greedy[i]
        cos = cosine_rows(lg, ref_lg)
        lp = _log_softmax(lg)[np.arange(len(toks.rest)), np.asarray(toks.rest)]
        per[toks.name] = {"positions": int(len(cos)), "cos_sum": float(cos.sum()), "cos_min": float(cos.min()),
                          "top1": int((np.argmax(lg, -1) == np.argmax(ref_lg, -1)).sum()),
                          "nll_sum": float(-lp.sum()), "greedy_prefix": common_prefix(g, ref_g)}
    return per, secs, reference if reference is not None else Reference(logits, greedy_ids)


def measure(lm, tokens: Sequence[Tokens], reference: Reference | None, steps: int = GREEDY_STEPS,
            timed: bool = True) -> tuple[dict, Reference]:
    """One row's metrics over ``tokens`` (against ``reference``; None: this row is the reference): each
    text's sums (``per_sample``) and the row's metrics from them (:func:`_aggregate`)."""
    load = psutil.getloadavg()[0]
    per, secs, reference = measure_texts(lm, tokens, reference, steps)
    all_secs = [x for s in secs for x in s]
    row = {**_aggregate(per, steps), "ms_per_token": median_ms(all_secs) if timed else None, "load_avg": round(load, 2)}
    return row, reference


def _aggregate(per: dict[str, dict], steps: int) -> dict:
    """A row's metrics from its texts' sums (``per_sample``): over every predicted position of every text."""
    n = sum(s["positions"] for s in per.values())
    prefixes = [s["greedy_prefix"] for s in per.values()]
    return {
        "tokens": n, "logits_cos_mean": sum(s["cos_sum"] for s in per.values()) / n,
        "logits_cos_min": min(s["cos_min"] for s in per.values()),
        "top1_agree": sum(s["top1"] for s in per.values()) / n,
        "ppl": math.exp(sum(s["nll_sum"] for s in per.values()) / n),
        "ppl_per_sample": {k: math.exp(s["nll_sum"] / s["positions"]) for k, s in per.items()},
        "greedy_prefix_mean": float(np.mean(prefixes) / steps),
        "greedy_equal": int(sum(p == steps for p in prefixes)), "greedy_prompts": len(prefixes),
        "per_sample": per,
    }


def merge_rows(runs: Sequence[Sequence[dict]], steps: int) -> list[dict]:
    """The rows of runs over disjoint texts (``--texts`` shards of one table, e.g. a simulator row too long
    for one sitting) as if run together: every row present in each run, its metrics recomputed from
    the per-text sums (``per_sample``) as :func:`measure` computes them, so a merged row equals the row
    of one run over all the texts (ms/token, a median, is left out)."""
    merged = []
    for name in [r["name"] for r in runs[0]]:
        parts = [next((r for r in run if r["name"] == name), None) for run in runs]
        if any(p is None for p in parts):
            raise ValueError(f"row {name!r} is missing from a run: runs to merge need the same rows")
        row = {k: v for k, v in parts[0].items() if k not in ("per_sample", "ppl_per_sample", "htp_hosts")}
        row["merged_from"] = len(parts)
        for key in ("nodes", "units"):  # per text, from runs as Ray tasks (kztts bench --ray)
            if any(key in p for p in parts):
                row[key] = {t: v for p in parts for t, v in (p.get(key) or {}).items()}
        failed = next((p["error"] for p in parts if p.get("error")), None)
        if failed:
            merged.append({**row, "error": failed})
            continue
        per: dict[str, dict] = {}
        for p in parts:
            if "per_sample" not in p:
                raise ValueError(f"row {name!r} has no per-text sums (written before kztts recorded them)")
            twice = set(per) & set(p["per_sample"])
            if twice:
                raise ValueError(f"text {sorted(twice)[0]!r} is in two runs: runs to merge need disjoint --texts")
            per.update(p["per_sample"])
        if "positions" in row:  # the reference row's token counts per text
            row["positions"] = {k: v for p in parts for k, v in p["positions"].items()}
        merged.append({**row, **_aggregate(per, steps), "ms_per_token": None})
    return merged


def open_row(spec: RowSpec, threads: int, context: int = DEFAULT_CONTEXT):
    """The row's ``kztts.lm.lm.LM`` (CPU rows at ``threads`` threads; ``context`` caps the CPU cache)."""
    lm = LM(spec.bundle, target=spec.target, placement=spec.placement, strict=spec.strict,
            check_saturation=spec.check_saturation, context=context if spec.target is None else None,
            session_config=SessionConfig(threads=threads))
    guard = getattr(lm.runner, "guard", None)
    if guard is not None and spec.guard_counts:
        guard.strict = False  # QNN stays strict (no silent CPU fallback); the guard only counts
    return lm


def _context_limit(specs: Sequence[RowSpec], context: int) -> int:
    """The smallest static context of the HTP rows' targets, and ``context``."""
    limits = [load_target(s.target).shapes.context for s in specs if s.target is not None]
    return min(limits + [context])


def _reference_key(spec: RowSpec, samples: Sequence[Sample], steps: int, limit: int) -> str:
    return json.dumps({"bundle": str(Path(spec.bundle).resolve()), "texts": [s.text for s in samples],
                       "steps": steps, "limit": limit}, sort_keys=True)


def save_reference(path: Path, key: str, row: dict, tokens: Sequence[Tokens], reference: Reference) -> None:
    """The fp32 row, its tokens and logits/greedy ids, for :func:`run_rows` in another process."""
    arrays = {f"logits_{i}": lg for i, lg in enumerate(reference.logits)}
    meta = {"key": key, "row": row, "tokens": [vars(t) for t in tokens], "greedy": reference.greedy}
    with open(path, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta)), **arrays)


def load_reference(path: Path, key: str) -> tuple[dict, list[Tokens], Reference] | None:
    """What :func:`save_reference` wrote, if it was made with the same bundle, texts, steps and context."""
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        if meta["key"] != key:
            log.warning("%s: saved for another bundle, text set, greedy steps or context; recomputing", path)
            return None
        logits = [z[f"logits_{i}"] for i in range(len(meta["tokens"]))]
    return meta["row"], [Tokens(**t) for t in meta["tokens"]], Reference(logits, meta["greedy"])


def row_header(spec: RowSpec) -> dict:
    """The keys every row starts with (its metrics follow, or its ``error``)."""
    return {"name": spec.name, "device": spec.device, "weights": spec.weights,
            "placement": spec.placement or ("cpu" if spec.target is None else "all-htp"),
            "guard": spec.check_saturation, "error": None}


def _row_facts(lm, row: dict) -> None:
    """What the row's LM says of its run: the guard's flagged HTP calls, its HTP host processes."""
    guard = getattr(lm.runner, "guard", None)
    if guard is not None:
        row["guard_flagged"] = int(guard.total)
    hosts = lm.plan.host_summary()
    if hosts:
        row["htp_hosts"] = [{"graphs": len(h["graphs"]), "mb": h["mb"]} for h in hosts]


def run_rows(specs: Sequence[RowSpec], *, samples: Sequence[Sample] = SAMPLES, threads: int = 2,
             steps: int = GREEDY_STEPS, context: int = DEFAULT_CONTEXT,
             on_row: Callable[[dict], None] | None = None, reference_file: Path | None = None) -> list[dict]:
    """Every row of ``specs`` (the first must be the fp32 CPU reference) over ``samples``, one row
    open at a time (a 1.5B bundle and its variants do not fit in memory together). The texts are
    cut to the smallest static context of the HTP rows and ``context`` (the CPU rows' cache). A row that fails to open
    or run (a graph refused by QNN, the fp16 guard under strict) records its ``error``. ``reference_file``:
    the fp32 row is read from it when it was saved for the same bundle, texts, steps and context
    (its row says ``"reused"``), else computed and saved there (one HTP row per process, one reference)."""
    if not specs or specs[0].device != "cpu" or specs[0].weights != "fp32":
        raise ValueError("the first row must be the fp32 CPU bundle (the reference)")
    limit = _context_limit(specs, context)
    rows: list[dict] = []
    tokens: list[Tokens] = []
    reference = None
    key = _reference_key(specs[0], samples, steps, limit)
    saved = load_reference(reference_file, key) if reference_file is not None and reference_file.exists() else None
    for i, spec in enumerate(specs):
        if i == 0 and saved is not None:
            row, tokens, reference = saved
            row = {**row, "reused": portable_path(reference_file)}
            log.info("lm_accuracy: %s reused from %s", spec.name, reference_file)
            rows.append(row)
            if on_row is not None:
                on_row(row)
            continue
        row = row_header(spec)
        rows.append(row)
        log.info("lm_accuracy: %s", spec.name)
        lm = None
        try:
            lm = open_row(spec, threads, limit)
            row["runner"] = lm.plan.runner
            if i == 0:
                tokens = tokenize(lm, samples, min(lm.context, limit), steps)
                row["positions"] = {t.name: len(t.prefill) + len(t.rest) for t in tokens}
            metrics, reference = measure(lm, tokens, reference, steps, timed=spec.device == "cpu")
            row.update(metrics)
            _row_facts(lm, row)
            if i == 0 and reference_file is not None:
                save_reference(reference_file, key, row, tokens, reference)
        except Exception as e:  # noqa: BLE001 - a refused row is a result of the table
            if i == 0:
                raise
            log.warning("%s: %s", spec.name, e)
            row["error"] = f"{type(e).__name__}: {e}"
        finally:
            if lm is not None:
                lm.plan.close()  # its HTP host processes hold GBs: the next row needs them
            lm = None
        if on_row is not None:
            on_row(row)
    return rows


def context_limit(specs: Sequence[RowSpec], context: int = DEFAULT_CONTEXT) -> int:
    """The positions every row's texts are cut to (:func:`run_rows`): the HTP rows' smallest static context,
    and ``context``."""
    return _context_limit(specs, context)


def run_text(spec: RowSpec, sample: Sample, *, threads: int, steps: int, limit: int,
             reference: dict | None = None) -> dict:
    """One (row, text) unit of a sweep run as tasks (``kztts bench --ray``): ``spec`` over ``sample`` alone.

    ``reference``: the fp32 row's unit of the same text (its ``ref_tokens``, ``ref_greedy``, ``ref_logits``);
    None: this is the fp32 row, and its result carries those for the other rows. The result keeps the text's
    sums (``per_sample``) and decode-step seconds (``step_s``): :func:`rows_from_texts` makes of the units
    the rows :func:`run_rows` gives (teacher forcing and greedy runs start from an empty cache per text, so a
    text measured alone gives the sums it gives among the others). A row that fails records its ``error``."""
    row = row_header(spec)
    lm = None
    try:
        lm = open_row(spec, threads, limit)
        row["runner"] = lm.plan.runner
        if reference is None:
            tokens = tokenize(lm, [sample], min(lm.context, limit), steps)
            row["positions"] = {t.name: len(t.prefill) + len(t.rest) for t in tokens}
            ref = None
        else:
            tokens = [Tokens(**reference["ref_tokens"])]
            ref = Reference([np.asarray(reference["ref_logits"])], [list(reference["ref_greedy"])])
        row["load_avg"] = round(psutil.getloadavg()[0], 2)
        per, secs, own = measure_texts(lm, tokens, ref, steps)
        row.update(per_sample=per, step_s=secs[0], peak_rss_mb=peak_rss_mb())  # this process: not its HTP hosts
        _row_facts(lm, row)
        if reference is None:
            row.update(ref_tokens=vars(tokens[0]), ref_greedy=own.greedy[0], ref_logits=own.logits[0])
    except Exception as e:  # noqa: BLE001 - a refused row is a result of the table
        log.warning("%s, %s: %s", spec.name, sample.name, e)
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        if lm is not None:
            lm.plan.close()
    return row


def rows_from_texts(specs: Sequence[RowSpec], samples: Sequence[Sample], results: Mapping[tuple[int, str], dict],
                    steps: int) -> list[dict]:
    """The rows of :func:`run_rows` from its (row, text) units (:func:`run_text`; ``results[(i, name)]``):
    each row's metrics from its texts' sums in the order of ``samples`` (so the floating-point sums are
    those of one run), ms/token the median of every decode step of its texts. A row with a failed unit
    records that unit's error (``"<text>: <error>"``), as a failed row of :func:`run_rows` does."""
    rows = []
    for i, spec in enumerate(specs):
        parts = [results[(i, s.name)] for s in samples]
        row = row_header(spec)
        failed = next(((s, p) for s, p in zip(samples, parts) if p.get("error")), None)
        if failed is not None:
            if failed[1].get("runner"):
                row["runner"] = failed[1]["runner"]
            row["error"] = f"{failed[0].name}: {failed[1]['error']}"
            rows.append(row)
            continue
        row["runner"] = parts[0]["runner"]
        if "positions" in parts[0]:
            row["positions"] = {k: v for p in parts for k, v in p["positions"].items()}
        row.update(_aggregate({s.name: p["per_sample"][s.name] for s, p in zip(samples, parts)}, steps))
        secs = [x for p in parts for x in p["step_s"]]
        row["ms_per_token"] = median_ms(secs) if spec.device == "cpu" else None
        row["load_avg"] = max(p["load_avg"] for p in parts)
        row["peak_rss_mb"] = max(p.get("peak_rss_mb", 0) for p in parts)
        if any("guard_flagged" in p for p in parts):
            row["guard_flagged"] = sum(int(p.get("guard_flagged", 0)) for p in parts)
        if parts[0].get("htp_hosts"):
            row["htp_hosts"] = parts[0]["htp_hosts"]
        rows.append(row)
    return rows


def _fmt(v, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown_table(rows: Sequence[dict]) -> str:
    """The rows as a markdown table (a failed row shows its error)."""
    head = ("| row | runner | logits cos mean | logits cos min | top-1 agree | ppl | greedy prefix | "
            "greedy equal | ms/token | load |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.get("error") and "tokens" not in r:
            lines.append(f"| {r['name']} | — | {r['error'][:120]} | | | | | | | |")
            continue
        lines.append(
            f"| {r['name']} | {r.get('runner', '')} | {_fmt(r['logits_cos_mean'], '.6f')} | "
            f"{_fmt(r['logits_cos_min'], '.6f')} | {_fmt(r['top1_agree'], '.3f')} | {_fmt(r['ppl'], '.3f')} | "
            f"{_fmt(r['greedy_prefix_mean'], '.3f')} | {r['greedy_equal']}/{r['greedy_prompts']} | "
            f"{_fmt(r['ms_per_token'], '.1f')} | {_fmt(r['load_avg'], '.2f') if r['device'] == 'cpu' else ''} |")
    return "\n".join(lines)
