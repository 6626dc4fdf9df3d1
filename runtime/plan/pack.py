"""A device bundle (``kztts pack``): exactly the files a target's plan opens on the device.

An exported bundle holds every graph any route may run: the plain, fused and batched CPU graphs, the static HTP
graphs and their source graphs beside their context binaries, the speech and speaker encoders. A device runs one
plan: the one ``resolve_plan`` decides for the target, strictly (no CPU fallback the bundle lacks a graph for). The
pack keeps, per role of that plan:

- on the HTP, the context binary prepared for the target (its EPContext model and binary files), else the static
  graph (a QDQ graph's weights are stored at their precision: int4 packed two to a byte);
- on the CPU, the graph the plan runs, with only the part of the shared weights file its tensors read (the file
  is rewritten, its records pointed at the new offsets, ``kztts.bundle.onnx_wire.relocated``);
- the tables (unless asked otherwise compact: the text projection applied once to every text id and stored 8 bits
  per row, judged against the fp32 rows; the codec tables fp16: ``kztts.bundle.table_compact``; a table kept as
  exported that is a view into the shared weights file, ``kztts.bundle.table_views``, points into the pack's where
  its CPU graphs carry it, else is written out as a .npy), the tokenizer, and the manifest of what is there
  (``packed``: target, source, graphs).

The speech and speaker encoders clone a voice from a recording; a device speaks with voices made elsewhere
(``kztts voice create`` on the full bundle) unless the pack keeps them (``voice_cloning``).
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kztts.bundle.bundle import TOKENIZER_FILE, Bundle
from kztts.bundle.manifest import BUILTIN_VOICE_KEY, KIND_LM, MANIFEST_NAME, write_manifest
from kztts.bundle.onnx_wire import copy_bytes, read_graph, relocated, tensor_alignment
from kztts.bundle.table_compact import (PROJECTED_COS_MIN, PROJECTION_TABLES, compact_tables, is_compact,
                                        project_text_table)
from kztts.bundle.table_views import moved_views
from kztts.core.atomic import atomic_path
from kztts.core.audio import synthetic_voice
from kztts.core.build_cache import check_output, disk_bytes, exclusive_output, staged_dir
from kztts.core.errors import KzttsError
from kztts.htp.targets import Target, load_target
from kztts.plan.resolve import resolve_plan
from kztts.runners.speaker import SpeakerEncoder

log = logging.getLogger(__name__)

PACK_KEY = "packed"  # the manifest's record of a pack
BUILTIN_VOICE_FILE = "voices/builtin.xvector.npy"
CLONING_ROLES = ("speaker_encoder", "speech_encoder")
TABLE_MODES = ("compact", "as-exported")


@dataclass(frozen=True)
class PackedGraph:
    """One graph of the pack: where the plan runs it and the form kept."""

    name: str
    role: str
    device: str
    form: str  # "context binary", "static graph", "CPU graph"
    files: tuple[str, ...]


@dataclass(frozen=True)
class PackReport:
    """What ``pack_bundle`` wrote."""

    out: Path
    target: str
    graphs: tuple[PackedGraph, ...]
    files: dict[str, int]  # path relative to ``out`` -> bytes
    source_bytes: int  # the whole source bundle
    tables: str  # "compact" or "as exported"

    @property
    def bytes(self) -> int:
        return sum(self.files.values())

    def to_json(self) -> dict:
        return {"out": str(self.out), "target": self.target, "bytes": self.bytes, "source_bytes": self.source_bytes,
                "tables": self.tables, "files": self.files,
                "graphs": [{"graph": g.name, "role": g.role, "device": g.device, "form": g.form,
                            "files": list(g.files)} for g in self.graphs]}


class _Packer:
    def __init__(self, bundle: Bundle, work: Path):
        self.bundle, self.src, self.work = bundle, Path(bundle.path), work
        self.m = bundle.manifest
        shared = self.m.data.get("weights")
        self.shared = (self.src / shared["file"]).resolve() if shared else None
        self.copied: set[Path] = set()

    def copy(self, rel: str) -> None:
        """Copy ``rel`` (relative to the bundle) once."""
        src = (self.src / rel).resolve()
        if src in self.copied:
            return
        if not src.is_file():
            raise KzttsError(f"{src}: missing from the bundle; re-export it")
        self.copied.add(src)
        dst = self.work / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)

    def graph_files(self, rel: str) -> tuple[list[str], list[tuple[int, int]]]:
        """(other files the ONNX file ``rel`` reads its tensors from, copied whole; the ranges of the shared weights
        file it reads)."""
        path = self.src / rel
        own = path.resolve()
        others, ranges = set(), set()
        for t in read_graph(path, probe=True).tensors:
            if t.source is None or Path(t.source[0]) == own:
                continue
            f = Path(t.source[0])
            if self.shared is not None and f == self.shared:
                ranges.add((t.source[1], t.source[2]))
            else:
                others.add(f.relative_to(self.src.resolve()).as_posix())
        return sorted(others), sorted(ranges)

    def write_shared(self, ranges: set[tuple[int, int]], rel: str) -> dict[tuple[int, int], int]:
        """The ranges of the shared weights file into the pack's own, in file order; their new offsets."""
        where, at = {}, 0
        (self.work / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(self.shared, "rb") as src, atomic_path(self.work / rel) as tmp, open(tmp, "wb") as dst:
            for offset, length in sorted(ranges):
                pad = -at % tensor_alignment(length)
                dst.write(b"\0" * pad)
                at += pad
                src.seek(offset)
                try:
                    copy_bytes(src, dst, length)
                except OSError as exc:
                    raise KzttsError(f"{src.name}: {exc}, short of what its graphs read; "
                                     "re-export the bundle") from None
                where[(offset, length)] = at
                at += length
        return where


def _role_graphs(plan, voice_cloning: bool) -> list[tuple[str, str, str]]:
    """(graph, role, device) of every graph the plan opens, each once."""
    out, seen = [], set()
    for role, step in plan.steps.items():
        if role in CLONING_ROLES and not voice_cloning:
            continue
        for g in step.graphs:
            if g not in seen and g in plan.bundle.manifest.graphs:
                seen.add(g)
                out.append((g, role, step.device))
    return out


def _projection_pays(embeddings: dict) -> bool:
    """The text projection stored (H columns) beats the 8-bit text table and its MLP when H is at most the table's
    width (0.6B: 1024 against 2048; 1.7B: equal, the MLP's 34 MB saved; the tiny models' H is twice theirs)."""
    if not all(n in embeddings for n in PROJECTION_TABLES) or is_compact(embeddings):
        return False
    return embeddings["text_proj_fc2_w"]["shape"][0] <= embeddings["text_embedding"]["shape"][1]


def _check_out(src: Path, out: Path, overwrite: bool) -> None:
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise KzttsError(f"{out}: the pack cannot be written into the bundle it packs; choose another -o")
    check_output(out, overwrite)


def pack_bundle(src: str | Path, out: str | Path, target: "str | Path | Target", *, voice_cloning: bool = False,
                tables: str = "compact", overwrite: bool = False) -> PackReport:
    """Write into ``out`` what ``target``'s plan opens from bundle ``src`` on the device (module docstring).
    ``tables``: "compact" (8-bit text rows, fp16 codec tables: their error, prompt rows at cosine 0.99996 on the
    0.6B shape (benchmarks/tables), is far below the HTP's own fp16 arithmetic), or "as-exported"."""
    src, out = Path(src), Path(out)
    if tables not in TABLE_MODES:
        raise KzttsError(f"tables {tables!r} is not one of {', '.join(TABLE_MODES)}")
    _check_out(src, out, overwrite)
    target = load_target(target)
    bundle = Bundle.open(src, load_graphs=False)
    plan = resolve_plan(bundle, target=target, strict=True, host_check=False)
    if not any(s.device == "htp" for s in plan.steps.values()):
        raise KzttsError(f"target {target.name} runs nothing of {src} on the HTP (its placement keys); a CPU "
                         "bundle needs no pack: copy it as it is, or pack for a target with HTP work")
    picks = _role_graphs(plan, voice_cloning)
    m = bundle.manifest
    compact = tables == "compact"
    source_bytes = disk_bytes(src)
    with exclusive_output(out), staged_dir(out) as work:
        _check_out(src, out, overwrite)
        packer = _Packer(bundle, work)
        specs, packed, plans = {}, [], {}
        for g, role, device in picks:
            spec = m.graphs[g]
            built_for = spec.extra.get("context_target", spec.extra.get("target"))
            extra = dict(spec.extra)
            if device == "htp" and spec.extra.get("context_file") and built_for == target.name:
                rel, form = spec.extra["context_file"], "context binary"
                extra["packed_context"] = True
                binaries = list(spec.extra.get("context_binaries", []))
            else:
                rel = spec.extra.get("htp_file", spec.file) if device == "htp" else spec.file
                form = "static graph" if device == "htp" else "CPU graph"
                binaries = []
                extra.pop("context_file", None)
                extra.pop("context_binaries", None)
            extra.pop("htp_file", None)
            others, ranges = packer.graph_files(rel)
            plans[g] = (rel, ranges)
            for f in [*binaries, *others]:
                packer.copy(f)
            specs[g] = replace(spec, file=rel, extra=extra)
            packed.append(PackedGraph(g, role, device, form, (rel, *binaries, *others)))
        weights = m.data.get("weights")
        needed = {r for _, ranges in plans.values() for r in ranges}
        where = packer.write_shared(needed, weights["file"]) if needed else {}
        for g, (rel, ranges) in plans.items():
            dst = work / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if ranges:
                def move(location: str, offset: int, length: int | None, base=(src / rel).parent):
                    if (base / location).resolve() != packer.shared:
                        return None
                    return location, where[(offset, length)]

                with atomic_path(dst) as tmp:
                    Path(tmp).write_bytes(relocated(src / rel, move))
            else:
                packer.copy(rel)
            specs[g] = replace(specs[g], extra={**specs[g].extra, "bytes": dst.stat().st_size})
        data = dict(m.data)
        data["graphs"] = {g: s.to_json() for g, s in specs.items()}
        if needed:
            data["weights"] = {**weights, "bytes": (work / weights["file"]).stat().st_size,
                               "graphs": sorted(g for g, (_, r) in plans.items() if r)}
        else:
            data.pop("weights", None)
        embeddings, tables_check = dict(m.embeddings), None
        if compact and _projection_pays(embeddings):
            embeddings, tables_check = project_text_table(src, work, embeddings)
            bound = PROJECTED_COS_MIN
            if not tables_check["cos_min"] >= bound:
                raise KzttsError(f"{src}: the projected text rows stored 8 bits per row reach cosine "
                                 f"{tables_check['cos_min']:.6f} of the fp32 ones, under the {bound} bound; pack "
                                 "with --tables as-exported")
            tables_check["bound"] = bound
        if compact:  # what is compact already stays as it is
            embeddings = compact_tables(src, work, embeddings)
        # a table viewed in the shared file: pointed into the pack's where its CPU graphs carry it, else a .npy
        embeddings = moved_views(src, work, embeddings, weights["file"] if weights else "", where)
        for spec in embeddings.values():
            for key in ("file", "scale_file"):
                if key in spec and not (work / spec[key]).exists():
                    packer.copy(spec[key])
        data["embeddings"] = embeddings
        for f in src.iterdir():  # the tokenizer and whatever else the bundle keeps beside its graphs and tables
            if f.is_file() and f.name != MANIFEST_NAME and not f.name.startswith("."):
                packer.copy(f.name)
        if not (work / TOKENIZER_FILE).is_file() and m.kind != KIND_LM:
            raise KzttsError(f"{src / TOKENIZER_FILE}: tokenizer missing; re-export the bundle")
        if m.kind != KIND_LM and m.tts_kind == "base" and not voice_cloning and "speaker_encoder" in m.graphs:
            # the built-in voice is the speaker encoder's x-vector of a synthetic recording: stored, it needs none
            xvector = SpeakerEncoder.from_bundle(bundle, bundle.session("speaker_encoder")).xvector(
                synthetic_voice(), 24000)
            (work / BUILTIN_VOICE_FILE).parent.mkdir(parents=True, exist_ok=True)
            np.save(work / BUILTIN_VOICE_FILE, np.asarray(xvector, np.float32))
            data[BUILTIN_VOICE_KEY] = {"file": BUILTIN_VOICE_FILE, "shape": [int(np.size(xvector))],
                                       "made_from": "kztts.core.audio.synthetic_voice(), by the speaker encoder"}
        if BUILTIN_VOICE_KEY in data and not (work / data[BUILTIN_VOICE_KEY]["file"]).is_file():
            packer.copy(data[BUILTIN_VOICE_KEY]["file"])  # a pack of a pack
        data[PACK_KEY] = {"target": target.name, "from": str(src.resolve()), "source_bytes": source_bytes,
                          "voice_cloning": voice_cloning, "tables": "compact" if compact else "as exported",
                          **({"tables_check": tables_check} if tables_check else {}),
                          "graphs": {p.name: {"role": p.role, "device": p.device, "form": p.form} for p in packed}}
        write_manifest(work, data)
        files = {f.relative_to(work).as_posix(): f.stat().st_size for f in sorted(work.rglob("*")) if f.is_file()}
    log.info("packed %s for %s into %s: %.1f MB of %.1f MB", src, target.name, out, sum(files.values()) / 1e6,
             source_bytes / 1e6)
    return PackReport(out, target.name, tuple(packed), files, source_bytes, "compact" if compact else "as exported")
