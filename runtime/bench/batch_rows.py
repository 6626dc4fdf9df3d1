"""``kztts bench --batch 1,2,4,8``: one batched row per CPU configuration and batch size
(``kztts.bench.batch_worker``), run in the same rotation as the other rows.

Batching runs the fused CPU graphs with the frame Code Predictor (``kztts.tts.batch_loop``), so only
the configurations with ``attention=fused`` and ``cp_mode=frame`` get batch rows."""
from __future__ import annotations

from kztts.core.errors import KzttsError

WORKER = "kztts.bench.batch_worker"


def parse_batches(raw: str | None) -> list[int]:
    """``"1,2,4,8"`` -> [1, 2, 4, 8]; empty or None -> [] (no batch rows)."""
    if not raw:
        return []
    parts = [v.strip() for v in raw.split(",") if v.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise KzttsError(f"--batch {raw!r}: give batch sizes >= 1, comma-separated (e.g. 1,2,4,8)")
    return sorted({int(p) for p in parts})


def batch_tasks(configs: list, batches: list[int]) -> list[tuple[str, tuple]]:
    """("batch", (config, B)) for every configuration batching can run."""
    return [("batch", (c, b)) for c in configs if c.attention == "fused" and c.cp_mode == "frame" and not c.pipeline
            for b in batches]


def spec(common: dict, bundle, config, batch: int, baseline) -> dict:
    return {**common, "bundle": str(bundle), "threads": config.threads, "batch": batch, "baseline": str(baseline)}


def tag(config, batch: int, rnd: int) -> str:
    return f"{config.slug}_batch{batch}_r{rnd}"


def finish(row: dict, config, batch: int) -> dict:
    """The merged row of a batch task, named and marked."""
    row.update(kind="kztts-batch", **config.as_dict())
    row.update(name=f"{config.name}/batch{batch}", batch=batch)
    return row
