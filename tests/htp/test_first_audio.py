"""``kztts inspect LM --target T --speak TTS``: the first audio after a chat message, stage by stage on paper (LM
prefill, first tokens, Talker prefill, first frame, first decoder run). Each stage is whole calls of one report
row; a Talker row counted on a CPU graph (no static graph for the target's shapes, as for the real 1.5B) stands
for the static graph of the precision, counted from the shapes: checked against real static w4a16 graphs."""
from __future__ import annotations

import json

import pytest

from kztts.htp import cost as C
from kztts.htp.targets import load_target


@pytest.fixture(scope="module")
def device_small(small_target, tmp_path_factory) -> str:
    """The small target (prefill + decode graphs, context 64, chunk 16) as a device with published-figure keys."""
    data = json.loads(small_target.read_text())
    data["runs_on"] = "device"
    data["cost"] = {"dram_gbps": 80.0, "dram_source": "a", "effective_gbps": 50.0, "effective_source": "b",
                    "htp_int8_tops": 40, "tops_source": "c"}
    p = tmp_path_factory.mktemp("targets") / small_target.name  # same name: the bundles' graphs were made for it
    p.write_text(json.dumps(data))
    return str(p)


@pytest.fixture(scope="module")
def w4a16_pair(qwen3_dir, tiny_dir, small_target):
    """The tiny LM and the tiny TTS with real static w4a16 graphs of the small target, and their CPU bundles."""
    from kztts.export.lm.bundle_writer import cached_lm_bundle
    from kztts.export.tts.bundle_writer import cached_bundle, cached_target_bundle

    return {"lm": (cached_lm_bundle(qwen3_dir, target=str(small_target), precision="w4a16"),
                   cached_lm_bundle(qwen3_dir)),
            "tts": (cached_target_bundle(tiny_dir, small_target, precision="w4a16"), cached_bundle(tiny_dir))}


def test_stages_are_whole_calls_of_the_report_rows(qwen3_bundle, htp_bundle, device_small, capsys):
    from kztts.cli.inspect import prompt_tokens, speak_report
    from kztts.cli.main import main

    report = speak_report(qwen3_bundle, htp_bundle, device_small)
    est, target = report["first_audio"], load_target(device_small)
    assert est["available"], est
    lm = {r["role"]: r for r in report["lm"]["graphs"]}
    tts = {r["role"]: r for r in report["tts"]["graphs"]}
    tokens = prompt_tokens(qwen3_bundle, C.SPOKEN_PROMPT)
    assert est["prompt_tokens"] == tokens > 16
    # the bundles' own static graphs: the rows as printed above the table
    want = [("LM prefill", lm["talker_prefill"], -(-tokens // 16)), ("first tokens", lm["talker_decode"], 1),
            ("Talker prefill", tts["talker_prefill"], 1), ("first frame", tts["code_predictor"], 1),
            ("first decoder run", tts["decoder"], 1)]
    assert [s["stage"] for s in est["stages"]] == [w[0] for w in want]
    for s, (_, row, calls) in zip(est["stages"], want):
        assert s["graph"] == row["graph"] and s["calls"] == calls and not s["static_from_shapes"], s
        assert s["ms"] == pytest.approx(calls * C.call_ms(row, target)), s["stage"]
    # a decode step here is the token the paper estimate counts
    assert est["stages"][1]["ms"] == pytest.approx(report["lm"]["paper_estimate"]["ms_per_token"])
    assert est["total_ms"] == pytest.approx(sum(s["ms"] for s in est["stages"]))
    assert main(["inspect", str(qwen3_bundle), "--target", device_small, "--speak", str(htp_bundle)]) == 0
    out = capsys.readouterr().out
    assert out.count("first audio at simulator") == 1 and f"{est['total_ms']:.1f}  to the first 80 ms" in out
    # several targets: a table each and one summary line
    assert main(["inspect", str(qwen3_bundle), "--target", f"{device_small},x_elite", "--speak", str(htp_bundle),
                 "--precision", "w4a16"]) == 0
    out = capsys.readouterr().out
    assert out.count("first audio at ") == 2 and "first audio on paper: simulator " in out and " x_elite " in out


def test_a_talker_counted_from_the_shapes_is_the_static_graph(w4a16_pair, qwen3_bundle, htp_bundle, device_small):
    """The CPU graph at the target's shapes, turned into the static graph of w4a16 from the shapes, has the real
    static w4a16 graph's inputs and outputs, KV and MACs to the byte. Its weights are the CPU graph's at w4a16 on
    paper; the static fp16 graph's at w4a16 on paper hold a few constants more (mask and probe scalars: 287 bytes
    on both tiny models, bounded at 1 kB), the QDQ graph's count as stored. Without the static layout the counts
    differ."""
    from kztts.bundle.manifest import read_manifest

    target = load_target(device_small)
    fp16 = {"lm": qwen3_bundle, "tts": htp_bundle}
    for name, (static, cpu) in w4a16_pair.items():
        real = {r["role"]: r for r in C.bundle_cost(static, target, precision="w4a16")["graphs"]}
        paper = {r["role"]: r for r in C.bundle_cost(cpu, target, precision="w4a16")["graphs"]}
        floats = {r["role"]: r for r in C.bundle_cost(fp16[name], target, precision="w4a16")["graphs"]}
        for role in ("talker_prefill", "talker_decode"):
            assert real[role]["graph"] == floats[role]["graph"] == role and paper[role]["graph"] == "talker"
            shaped = C.as_static(paper[role], read_manifest(cpu), target, "w4a16")
            for key in ("io_bytes", "kv_read_bytes", "kv_write_bytes", "macs", "kv_dtype"):
                assert shaped[key] == real[role][key], (name, role, key)
            extra = floats[role]["weight_read_bytes"] - shaped["weight_read_bytes"]
            print(f"\n{name} {role}: weights read at w4a16, CPU graph {shaped['weight_read_bytes']} bytes, static fp16 "
                  f"graph {floats[role]['weight_read_bytes']} (+{extra}), QDQ graph as stored "
                  f"{real[role]['weight_read_bytes']}")
            assert 0 <= extra <= 1024, (name, role)
            if role == "talker_prefill":  # the unturned CPU row is not the static graph
                assert paper[role]["io_bytes"] != real[role]["io_bytes"] and paper[role]["macs"] < real[role]["macs"]


def test_speak_bad_input_is_one_line(qwen3_bundle, htp_bundle, capsys):
    from kztts.cli.main import main

    for args, want in (
            ([str(htp_bundle), "--target", "sm8750", "--speak", str(qwen3_bundle)],
             "a TTS bundle; inspect --speak takes an LM bundle first"),
            ([str(qwen3_bundle), "--target", "sm8750", "--speak", str(qwen3_bundle)], "an LM bundle; give a TTS"),
            ([str(qwen3_bundle), "--speak", str(htp_bundle)], "give --target T"),
            ([str(qwen3_bundle), "--target", "sm8750,nope", "--speak", str(htp_bundle)], "nope")):
        assert main(["inspect", *args]) == 2
        err = capsys.readouterr().err
        assert want in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_an_int4_cpu_graph_counts_at_an_asked_precision_as_its_float_graph(chat_bundle):
    """The real 1.5B's bundle is CPU int4 (MatMulNBits): asked for w4a16 on paper, each of its weights counts as the
    [K, N] weight it stands for, as the fp32 graph's do; without a precision, as stored (int4 codes, fp32 scales)."""
    from kztts.export.common.variants import cached_variant

    int4 = cached_variant(chat_bundle, weights="int4")
    target = load_target("sm8750")
    for precision in ("w4a16", "w8a16"):
        floats = {r["role"]: r for r in C.bundle_cost(chat_bundle, target, precision=precision)["graphs"]}
        codes = {r["role"]: r for r in C.bundle_cost(int4, target, precision=precision)["graphs"]}
        for role, r in codes.items():
            for key in ("device_weight_bytes", "weight_read_bytes", "bytes_per_call", "macs"):
                assert r[key] == floats[role][key], (precision, role, key)
    stored = {r["role"]: r for r in C.bundle_cost(int4, target)["graphs"]}
    asked = {r["role"]: r for r in C.bundle_cost(int4, target, precision="fp16")["graphs"]}
    assert stored["talker_decode"]["weight_read_bytes"] < asked["talker_decode"]["weight_read_bytes"]
