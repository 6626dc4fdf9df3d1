"""The HTP rows of ``kztts bench`` (parent side): their static context, their target file and
their bundle.

An HTP row runs a qnn_configs target's static graphs on the HTP simulator of onnxruntime-qnn
(``kztts.bench.htp_worker``), for accuracy only. Its bundle is the fp32 base bundle plus that
target's static graphs (``kztts.export.htp.static_graphs.export_htp_graphs``: fp16 float graphs, or
w8a16 QDQ graphs calibrated on real prompts), exported at a small static context so the
simulator stays quick, with their QNN context binaries (``--context-binary``: what a device
loads); every base file is a hard link (a symbolic link when the bundle is built on another
file system, ``--htp-dir``: a 0.6B HTP bundle adds ~4 GB of static graphs).
The export side (torch) is imported only when a bundle is built.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

from kztts.bundle.manifest import read_manifest, write_manifest
from kztts.core.build_cache import build_once, code_key, staged_dir
from kztts.htp.targets import load_target

log = logging.getLogger(__name__)

MIN_CONTEXT = 64  # the smallest static context the bench uses (the tests' simulator context)
CONTEXT_STEP = 16


def bench_context(prompt_positions: int, frames: int) -> int:
    """The static Talker context an HTP row needs: the prompt plus ``frames`` frames (``C - 1``
    usable positions hold prompt + frames - 1 inputs), rounded up, at least :data:`MIN_CONTEXT`."""
    need = int(prompt_positions) + int(frames)
    return max(MIN_CONTEXT, CONTEXT_STEP * math.ceil(need / CONTEXT_STEP))


def bench_target_file(target: str, context: int, out_dir: Path) -> Path:
    """A copy of ``target``'s file with static context ``context`` and a prefill chunk that fits it
    (the target's, at most half the context), validated by :func:`kztts.htp.targets.load_target`."""
    t = load_target(target)
    data = json.loads(t.path.read_text())
    data["shapes"].update(context=int(context), prefill_chunk=min(t.shapes.prefill_chunk, int(context) // 2))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{t.path.stem}-ctx{context}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    load_target(path)
    return path


def make_htp_bundle(base: Path, model_dir: Path, target_file: Path, precision: str, out: Path) -> Path:
    """Write ``base`` + the static HTP graphs of ``target_file`` at ``precision`` into ``out``."""
    from kztts.export.common.checkpoint import load_reference
    from kztts.export.htp.export_plan import plan_export
    from kztts.export.htp.static_graphs import export_htp_graphs
    from kztts.export.common.bundle_output import link_tree
    from kztts.export.tts.prompt_calibration import TtsPrompts

    manifest = read_manifest(base)
    data = json.loads(json.dumps(manifest.data))
    plan = plan_export(model_dir, kind="tts", target=target_file, precision=precision, context_binary=True)
    target = plan.target
    export_id = manifest.graphs["talker"].extra.get("export_id", "unbundled")
    cp_file = manifest.graphs["cp_frame"].file if "cp_frame" in manifest.graphs else None
    with staged_dir(out) as work:
        # cp_frame is re-stamped in place by the HTP export: copy it, never write through a link. The shared
        # weights file is copied: a second hard link to it makes onnx refuse to load the base's graphs (a data
        # file with two names is taken for an attack), and ONNX Runtime refuses a symbolic link out of the folder
        shared = manifest.data.get("weights")
        link_tree(base, work, ({cp_file} if cp_file else set()) | ({shared["file"]} if shared else set()),
                  across_fs="symlink")
        if shared:
            shutil.copy2(base / shared["file"], work / shared["file"])
        if cp_file:
            shutil.copy2(base / cp_file, work / cp_file)
        write_manifest(work, data)  # the calibration reads the base's tables through it (a table may be a view)
        model = load_reference(model_dir).model
        # with their QNN context binaries, as a device bundle ships: a session loads the compiled
        # graph (fp16 weights) instead of holding the fp32 ONNX beside its compilation
        specs = export_htp_graphs(model, work, export_id=export_id, plan=plan, calibration=TtsPrompts(model))
        del model
        data["graphs"].update({n: s.to_json() for n, s in specs.items()})
        data["bench_htp"] = {"base": base.name, "target": target.name, "precision": precision,
                             "context": target.shapes.context, "prefill_chunk": target.shapes.prefill_chunk}
        write_manifest(work, data)
    return out


def cached_htp_bundle(base: str | Path, model_dir: str | Path, target_file: str | Path, precision: str,
                      root: str | Path | None = None) -> Path:
    """The HTP bundle of an HTP row, built once in ``root`` (default: next to ``base`` in the cache),
    keyed by the target file, the precision and this module's code (the exporter's own code is in
    the base bundle's name)."""
    base, target_file = Path(base).resolve(), Path(target_file)
    root = Path(root) if root else base.parent
    key = code_key(target_file, __file__, extra=precision.encode(), length=8)
    out = root / f"{base.name}.htp-{target_file.stem}-{precision}-{key}"

    def build(work: Path) -> None:
        log.info("exporting the %s HTP graphs of %s at %s", precision, target_file.stem, base.name)
        make_htp_bundle(base, Path(model_dir), target_file, precision, work)

    return build_once(out, build)
