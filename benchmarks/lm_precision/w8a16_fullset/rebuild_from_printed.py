"""How benchmarks/lm_precision/w8a16_fullset/{english,chinese}/lm_accuracy.json (then
benchmarks/lm_w8a16_fullset/) were built: the shard reports of the full-set w8a16 all-htp row for those two
texts, rebuilt from the figures printed for them in benchmarks/README.md (commits 41ef43e, 32c4b06; that
text is now in benchmarks/lm_precision/README.md) after their run directories were lost with their machine.
Per-text sums = printed mean x positions, so exact to the printed digits. The ``reconstructed_from`` text
below is what the kept reports say, so it keeps the README's path of that time. Usage:
    python benchmarks/lm_precision/w8a16_fullset/rebuild_from_printed.py \\
        benchmarks/lm_precision/w8a16_fullset/code/lm_accuracy.json benchmarks/lm_precision/w8a16_fullset
(a measured shard supplies the rows' names and structure; the facts of the lost runs are "unknown")."""
import json
import math
import sys
from pathlib import Path

from kztts.eval.lm_accuracy import _aggregate  # a row's metrics from its per-text sums, as measured rows get them

template = json.loads(Path(sys.argv[1]).read_text())  # a measured shard's lm_accuracy.json (for the metadata)
out = Path(sys.argv[2])
FIG = {  # text: positions, token count, fp32 ppl, w8a16 cos mean, cos min, top-1, ppl, greedy prefix, wall, commit
    "english": (47, 61, 14.459, 0.998966, 0.993398, 0.979, 15.323, 0, "1 h 23 min", "41ef43e"),
    "chinese": (46, 54, 5.911, 0.995753, 0.975056, 0.913, 6.075, 2, "1 h 22 min", "32c4b06"),
}
for text, (n, ntok, p32, cos, cmin, top1, ppl, prefix, wall, commit) in FIG.items():
    k = round(top1 * n)
    assert abs(k / n - top1) < 5e-4, (text, k, n)
    steps = template["greedy_steps"]
    rows = []
    for r in template["rows"]:
        r = {k2: v for k2, v in r.items() if k2 not in ("htp_hosts", "ms_per_token", "load_avg", "reused")}
        if r["name"] == "cpu fp32":
            per = {"positions": n, "cos_sum": float(n), "cos_min": 1.0, "top1": n, "nll_sum": n * math.log(p32),
                   "greedy_prefix": steps}
            r["positions"] = {text: ntok}
        else:
            per = {"positions": n, "cos_sum": cos * n, "cos_min": cmin, "top1": k, "nll_sum": n * math.log(ppl),
                   "greedy_prefix": prefix}
        r.update({**_aggregate({text: per}, steps), "ms_per_token": None})
        rows.append(r)
    # What the printed figures do not say (the run's model, bundles, threads, command) is "unknown",
    # never the measured shard's: --merge skips unknown facts and refuses differing known ones.
    unknown = {"name": "unknown", "digest": "unknown"}
    d = {**template, "model": "unknown", "bundle": unknown, "w8a16_bundle": unknown, "threads": "unknown",
         "texts": [text], "rows": rows, "load_avg_end": None, "command": "unknown",
         "reconstructed_from": f"benchmarks/README.md's per-text table ({commit}): the run's own report was lost "
                               f"with its machine; sums = printed figures x positions, exact to the printed digits",
         "wall": wall}
    (out / text).mkdir(parents=True, exist_ok=True)
    (out / text / "lm_accuracy.json").write_text(json.dumps(d, indent=1), encoding="utf-8")
    print(text, "written")
