"""``kztts bench --ray`` (``kztts.bench.ray_units``): rows as Ray tasks on a local Ray (``ray.init(num_cpus=2)``)
and on a two-node cluster on this machine, on the tiny TTS and the tiny Qwen3 LM. The ``--ray`` tables equal
the sequential ones (accuracy columns: timings differ); killed units are retried; a rerun after an
interruption runs only the missing units; shards of two bundles, or of two code versions, refuse to merge."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

ray = pytest.importorskip("ray")

# one auth mode for the in-process Ray, the drivers and the nodes started here (Ray's default, tokens, needs
# RAY_AUTH_MODE=token on every client: docs/CLUSTER.md)
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}
LM_ACCURACY = ("name", "runner", "error", "tokens", "positions", "logits_cos_mean", "logits_cos_min", "top1_agree",
               "ppl", "ppl_per_sample", "greedy_prefix_mean", "greedy_equal", "greedy_prompts", "per_sample",
               "guard_flagged")
TTS_ACCURACY = ("name", "kind", "error", "talker_cos_min", "cp_cos_min", "talker_argmax_agreement",
                "cp_argmax_agreement", "code_agreement", "snr_db", "e2e_snr_db", "cp_codes_match", "prefill_positions",
                "runs", "placement")


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs in this process (the bench uses it: ``--ray`` joins the Ray it finds); its address."""
    old = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def lm_args(model, bundle, out, *extra) -> list[str]:
    return ["bench", "--lm", str(model), "--lm-bundle", str(bundle), "--weights", "fp32,int8,int4", "--threads", "1",
            "--greedy-steps", "8", "--lm-context", "64", "--out", str(out), *extra]


def tts_args(out, *extra) -> list[str]:
    return ["bench", "--size", "tiny", "--kv", "fp32", "--cp-mode", "frame", "--threads", "1", "--frames", "4",
            "--warmup", "1", "--no-reference", "--e2e-runs", "0", "--out", str(out), *extra]


def run_cli(args: list[str]) -> int:
    from kztts.cli.main import main

    return main(args)


def lm_report(out: Path) -> dict:
    return json.loads((out / "lm_accuracy.json").read_text())


def cells(md: str, first: str, columns: slice) -> list[list[str]]:
    """The table rows of ``md`` (lines starting with ``first``), cut to ``columns``."""
    return [[c.strip() for c in line.strip().strip("|").split("|")][columns]
            for line in md.splitlines() if line.startswith(first)]


def assert_same_lm_tables(a: Path, b: Path) -> None:
    """Every accuracy figure of two LM reports equal, exactly, and their tables' accuracy cells."""
    ra, rb = lm_report(a)["rows"], lm_report(b)["rows"]
    assert [r["name"] for r in ra] == [r["name"] for r in rb]
    for x, y in zip(ra, rb):
        assert {k: x.get(k) for k in LM_ACCURACY} == {k: y.get(k) for k in LM_ACCURACY}, x["name"]
    acc = slice(0, 8)  # row .. greedy equal (ms/token and load are timings)
    ta, tb = (cells((d / "lm_accuracy.md").read_text(), "| cpu", acc) + cells((d / "lm_accuracy.md").read_text(),
                                                                               "| htp", acc) for d in (a, b))
    assert ta == tb and len(ta) == len(ra)


def assert_same_tts_tables(a: Path, b: Path) -> None:
    ra, rb = (json.loads((d / "results.json").read_text())["rows"] for d in (a, b))
    assert [r["name"] for r in ra] == [r["name"] for r in rb]
    for x, y in zip(ra, rb):
        assert {k: x.get(k) for k in TTS_ACCURACY} == {k: y.get(k) for k in TTS_ACCURACY}, x["name"]
    acc = slice(-6, None)  # talker cos min .. audio SNR dB
    main_table = [(d / "results.md").read_text().split("\ntext -> WAV file")[0] for d in (a, b)]  # not e2e's
    ta, tb = (cells(md, "| ", acc)[1:] for md in main_table)  # [0]: the header
    assert ta == tb and len(ta) == len(ra)


@pytest.fixture(scope="module")
def lm_sequential(qwen3_dir, qwen3_bundle, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm_seq")
    assert run_cli(lm_args(qwen3_dir, qwen3_bundle, out)) == 0
    return out


def scratch_pids() -> list[int]:
    """The processes named by the unit tasks' scratch folders on this machine (``kztts-unit-<pid>-*``)."""
    return [int(d.name.split("-")[2]) for d in Path(tempfile.gettempdir()).glob("kztts-unit-*-*")
            if d.name.split("-")[2].isdigit()]


def finished(out: Path) -> list[Path]:
    """A --ray run's finished unit files: not the hidden temporary names of a write under way."""
    return sorted(f for f in (out / "units").glob("*.json") if not f.name.startswith("."))


def units_of(out: Path) -> dict[str, dict]:
    """{unit name: its kept file} of a --ray run's folder."""
    return {d["name"]: d for d in (json.loads(f.read_text()) for f in finished(out))}


# ------------------------------------------------------------------ local Ray
def test_lm_rows_via_ray_equal_the_sequential_rows(local_ray, qwen3_dir, qwen3_bundle, lm_sequential, tmp_path):
    """Each (row, text) a task: the table equals the sequential one; every unit kept, keyed, its node recorded;
    the report carries the code version, and no machine folder."""
    from kztts.bench.ray_units import code_version

    out = tmp_path / "ray"
    assert run_cli(lm_args(qwen3_dir, qwen3_bundle, out, "--ray")) == 0
    assert_same_lm_tables(lm_sequential, out)
    report = lm_report(out)
    assert report["code_version"] == lm_report(lm_sequential)["code_version"] == code_version("lm")
    assert report["ray"]["units"] == 12 and len(report["ray"]["ran"]) == 12 and not report["ray"]["failed"]
    node = report["ray"]["nodes"][0]["id"]
    units = units_of(out)
    assert len(units) == 12 and all(u["result"]["node"]["id"] == node and u["result"]["attempts"] == 1
                                    for u in units.values())
    assert all(r["nodes"] == {t: node for t in ("code", "english", "french", "chinese")} for r in report["rows"])
    for u in units.values():  # each unit asked Ray for more memory than its process took
        assert 0 < u["result"]["peak_rss_mb"] < u["resources"]["memory_mb"] and u["resources"]["whole_node"], u["name"]
    int8 = units["cpu-int8_french"]
    assert int8["identity"]["text"]["name"] == "french" and int8["identity"]["bundle"]["digest"]
    assert int8["identity"]["reference"] == units["cpu-fp32_french"]["key"]  # measured against that text's fp32
    assert str(tmp_path) not in (out / "lm_accuracy.json").read_text()
    assert not any(str(Path.home()) in f.read_text() for f in finished(out))


class Killer(threading.Thread):
    """Kills, once, the first LM unit process whose spec starts with ``child`` (SIGKILL: the row's process
    dies, its Ray task returns), and the Ray worker running the first unit whose spec starts with ``worker``
    (the task itself dies)."""

    def __init__(self, child: str, worker: str):
        super().__init__(daemon=True)
        self.want = {"child": child, "worker": worker}
        self.killed: dict[str, str] = {}
        self.leftovers: list[Path] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and len(self.killed) < 2:
            for proc in psutil.process_iter(["cmdline"]):
                cmd = proc.info["cmdline"] or []
                if len(cmd) < 4 or cmd[1:3] != ["-m", "kztts.bench.ray_units"]:
                    continue
                spec = Path(cmd[3])
                try:
                    if "child" not in self.killed and spec.name.startswith(self.want["child"]):
                        proc.kill()
                        self.killed["child"] = spec.name
                    elif "worker" not in self.killed and spec.name.startswith(self.want["worker"]):
                        parent = proc.parent()
                        assert parent is not None and parent.cmdline()[0].startswith("ray::"), parent
                        parent.kill()
                        proc.kill()
                        self.killed["worker"] = spec.name
                        self.leftovers.append(spec.parent)  # its task's temporary folder, never cleaned
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.002)


def test_a_killed_unit_is_retried_and_the_table_completes(local_ray, qwen3_dir, qwen3_bundle, lm_sequential, tmp_path):
    """A unit whose row process is killed, and one whose Ray worker is killed, run again (bounded): the table
    completes, equal to the sequential one, and each of them says how its first attempt ended."""
    out = tmp_path / "ray"
    killer = Killer("cpu-int4_french", "cpu-int8_")
    killer.start()
    try:
        assert run_cli(lm_args(qwen3_dir, qwen3_bundle, out, "--ray")) == 0
    finally:
        killer.done.set()
        killer.join()
        for d in killer.leftovers:
            shutil.rmtree(d, ignore_errors=True)
    assert set(killer.killed) == {"child", "worker"}, killer.killed
    assert_same_lm_tables(lm_sequential, out)
    units = units_of(out)
    child = units["cpu-int4_french"]["result"]
    assert child["attempts"] == 2 and "killed by signal 9" in child["failures"][0], child.get("failures")
    worker = units[killer.killed["worker"].split(".")[0]]["result"]
    assert worker["attempts"] == 2 and worker["failures"][0].startswith("attempt 1: "), worker.get("failures")
    assert sum(u["result"]["attempts"] for u in units.values()) == 12 + 2
    assert not lm_report(out)["ray"]["failed"]


def test_a_rerun_after_an_interruption_runs_only_the_missing_units(local_ray, qwen3_dir, qwen3_bundle, lm_sequential,
                                                                    tmp_path):
    """A driver killed mid-run leaves its finished units; the rerun with the same --out keeps them untouched,
    runs the others, and its table equals the sequential one."""
    out = tmp_path / "ray"
    log = tmp_path / "driver.log"
    with open(log, "w") as f:
        driver = subprocess.Popen([sys.executable, "-m", "kztts.cli.main",
                                   *lm_args(qwen3_dir, qwen3_bundle, out, "--ray", local_ray)],
                                  stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **RAY_ENV})
        deadline = time.monotonic() + 240
        while driver.poll() is None and time.monotonic() < deadline:
            if len(finished(out)) >= 5:
                driver.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        driver.wait(30)
    assert driver.returncode == -signal.SIGKILL, log.read_text()[-2000:]
    kept = {f.name: f.read_bytes() for f in (out / "units").iterdir() if not f.name.startswith(".")}
    names = {json.loads(kept[n])["name"] for n in kept if n.endswith(".json")}
    assert 5 <= len(names) < 12 and not (out / "lm_accuracy.json").exists()
    deadline = time.monotonic() + 60  # Ray ends the dead driver's tasks: then their scratch folders are stale
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in scratch_pids()):
        time.sleep(0.2)
    assert run_cli(lm_args(qwen3_dir, qwen3_bundle, out, "--ray")) == 0
    report = lm_report(out)["ray"]
    assert set(report["reused"]) == names and len(report["ran"]) == 12 - len(names) and not report["failed"]
    assert all((out / "units" / n).read_bytes() == data for n, data in kept.items())  # nothing done twice
    assert not list((out / "units").glob(".*"))  # a write the kill cut short left no temporary file behind
    assert not [pid for pid in scratch_pids() if not psutil.pid_exists(pid)]  # the killed tasks' scratch, removed
    assert_same_lm_tables(lm_sequential, out)


def test_shards_of_two_bundles_or_code_versions_refuse_to_merge(local_ray, qwen3_dir, qwen3_bundle, lm_sequential,
                                                                tmp_path, capsys):
    """--ray shards over disjoint texts merge into the sequential table; a shard of another bundle, or of
    another code version, is refused in one line naming the difference."""
    from kztts.bench.lm import main as bench_lm

    other = tmp_path / "other-bundle"
    shutil.copytree(qwen3_bundle, other)
    (other / "notes.txt").write_text("one more file: another bundle digest\n")

    def shard(out, bundle, texts):
        assert run_cli(lm_args(qwen3_dir, bundle, out, "--texts", texts, "--ray")) == 0

    shard(tmp_path / "a", qwen3_bundle, "code,english")
    shard(tmp_path / "b", qwen3_bundle, "french,chinese")
    shard(tmp_path / "c", other, "french,chinese")
    assert bench_lm(["--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 0
    merged, sequential = lm_report(tmp_path / "m")["rows"], lm_report(lm_sequential)["rows"]
    for x, y in zip(merged, sequential):
        assert {k: x.get(k) for k in LM_ACCURACY} == {k: y.get(k) for k in LM_ACCURACY}, x["name"]
        assert list(x["nodes"]) == ["code", "english", "french", "chinese"]  # each text's node, from its shard
    capsys.readouterr()
    with pytest.raises(SystemExit):
        bench_lm(["--merge", str(tmp_path / "a"), str(tmp_path / "c"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert "the runs differ in bundle" in err[-1] and str(tmp_path / "c") in err[-1]
    report = tmp_path / "b" / "lm_accuracy.json"
    data = json.loads(report.read_text())
    report.write_text(json.dumps({**data, "code_version": "0" * 16}))
    with pytest.raises(SystemExit):
        bench_lm(["--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "x")])
    assert "the runs differ in code_version" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tts_sequential(tmp_path_factory):
    out = tmp_path_factory.mktemp("tts_seq")
    assert run_cli(tts_args(out, "--weights", "fp32,int8")) == 0
    return out


def test_tts_rows_via_ray_equal_the_sequential_rows(local_ray, tts_sequential, tmp_path):
    """The TTS grid's rows as tasks: the same table, plot and JSON; each row records its node and the bandwidth
    that node measured; a rerun with the same --out reuses the baseline and every row."""
    out = tmp_path / "ray"
    assert run_cli(tts_args(out, "--weights", "fp32,int8", "--ray")) == 0
    assert_same_tts_tables(tts_sequential, out)
    for name in ("results.json", "results.csv", "results.md", "pareto.png"):
        assert (out / name).stat().st_size > 0, name
    data = json.loads((out / "results.json").read_text())
    node = data["ray"]["nodes"][0]["id"]
    assert len(data["ray"]["ran"]) == 2 and not data["ray"]["reused"] and "--ray" in data["command"]
    units = units_of(out)
    for r in data["rows"]:
        assert r["node"]["id"] == node and r["attempts"] == 1 and r["bandwidth_probe"]["gb_s"] > 0
        assert r["talker_limit_pct"] > 0 and r["frame_ms"] > 0
        asked = units[r["unit"].rsplit(".", 2)[0]]["resources"]
        assert asked["whole_node"] and r["peak_rss_mb"] < asked["memory_mb"], (asked, r["peak_rss_mb"])  # declared
    assert "--ray: every row a Ray task on 1 node(s)" in data["header"]
    assert run_cli(tts_args(out, "--weights", "fp32,int8", "--ray")) == 0
    again = json.loads((out / "results.json").read_text())
    assert len(again["ray"]["reused"]) == 2 and not again["ray"]["ran"]
    assert [r["frame_ms"] for r in again["rows"]] == [r["frame_ms"] for r in data["rows"]]  # kept, not re-measured
    assert_same_tts_tables(tts_sequential, out)


@pytest.mark.slow
def test_reference_and_end_to_end_rows_via_ray(local_ray, tmp_path):
    """The qwen-tts reference row (its own checkpoint by path, torch on the node) and the end-to-end pair run as
    timed units: the reference row's accuracy equals the sequential one's, the pair is reported with its node."""
    flags = ["bench", "--size", "tiny", "--weights", "fp32", "--kv", "fp32", "--cp-mode", "frame", "--threads", "1",
             "--frames", "4", "--warmup", "1", "--e2e-runs", "1"]
    assert run_cli([*flags, "--out", str(tmp_path / "seq")]) == 0
    assert run_cli([*flags, "--out", str(tmp_path / "ray"), "--ray"]) == 0
    assert_same_tts_tables(tmp_path / "seq", tmp_path / "ray")
    data = json.loads((tmp_path / "ray" / "results.json").read_text())
    ref, fp32 = (next(r for r in data["rows"] if r["kind"] == kind) for kind in ("reference", "kztts"))
    assert ref["code_agreement"] == 1.0 and ref["frame_ms"] > 0 and ref["node"]["id"] == data["ray"]["nodes"][0]["id"]
    assert fp32["speedup"] > 0 and ref["bandwidth_probe"]["gb_s"] > 0  # against the reference measured on its node
    e2e = data["e2e"]
    assert e2e["frames"] == 4 and e2e["ratio"] > 0 and e2e["node"]["id"] == ref["node"]["id"]
    assert sorted(data["ray"]["ran"]) == ["e2e", "fp32_kv-fp32_cp-frame_dec-fp32_t1_r0", "reference_t1_r0"]
    assert "text->wav fp32" in (tmp_path / "ray" / "results.md").read_text()


def test_ray_flag_errors(qwen3_dir, qwen3_bundle, tmp_path, capsys):
    """--ray with --reference, and an address where no Ray listens (in a process that has joined no Ray), are
    refused in one line, at once."""
    args = lm_args(qwen3_dir, qwen3_bundle, tmp_path / "x", "--ray", "--reference", str(tmp_path / "r.npz"))
    assert run_cli(args) == 2
    assert "--reference: with --ray" in capsys.readouterr().err
    port = _free_port()
    for address, words in ((f"127.0.0.1:{port}", "nothing answers there"), ("somehost", "give the head's HOST:PORT")):
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "kztts.cli.main", *lm_args(qwen3_dir, qwen3_bundle, tmp_path / "y",
                                                                              "--ray", address)],
                           capture_output=True, text=True, env={**os.environ, **RAY_ENV}, timeout=300, check=False)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2 and last.startswith(f"kztts: error: --ray {address}: {words}"), r.stderr[-2000:]
        assert time.monotonic() - started < 60


# ------------------------------------------------------------------ two nodes on this machine
def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class TwoNodes:
    """``ray start --head`` and ``ray start --address`` (one CPU each, their own temp dirs), in the foreground
    (``--block``) so that ending those two processes ends their nodes."""

    def __init__(self, root: Path):
        self.env = {**os.environ, **RAY_ENV}
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.root = root

    def start(self) -> None:
        root = self.root
        ray_cli = str(Path(sys.executable).with_name("ray"))

        def common() -> list[str]:  # each node its own agent port: both run on this machine
            return ["--block", "--num-cpus=1", "--disable-usage-stats", f"--dashboard-agent-listen-port={_free_port()}"]

        self.procs.append(self._start([ray_cli, "start", "--head", f"--port={self.port}", "--include-dashboard=false",
                                       f"--dashboard-port={_free_port()}", f"--temp-dir={root / 'head'}", *common()],
                                      root / "head.log"))
        self._wait(1)
        self.procs.append(self._start([ray_cli, "start", f"--address={self.address}", f"--temp-dir={root / 'worker'}",
                                       *common()], root / "worker.log"))
        self._wait(2)

    def _start(self, argv: list[str], log: Path) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def _wait(self, nodes: int) -> None:
        probe = (f"import ray; ray.init(address={self.address!r}, log_to_driver=False); "
                 "print(sum(n['Alive'] and n['Resources'].get('CPU', 0) > 0 for n in ray.nodes()))")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert all(p.poll() is None for p in self.procs), "a ray start process ended"
            try:
                r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=self.env,
                                   timeout=60, check=False)
                if r.returncode == 0 and r.stdout.strip() == str(nodes):
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)
        raise AssertionError(f"the Ray cluster did not reach {nodes} node(s)")

    def stop(self) -> None:
        tree = []
        for p in self.procs:
            try:
                tree += psutil.Process(p.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for child in tree:  # whatever the two did not end themselves (only processes they started)
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.slow
def test_two_node_cluster_spreads_units_and_gives_the_same_tables(qwen3_dir, qwen3_bundle, small_target,
                                                                  tts_sequential, tmp_path):
    """Units spread over both nodes of a two-node cluster (each result names its node), the LM rows (CPU rows
    and one HTP simulator row) and the TTS grid equal to the sequential tables."""
    from kztts.htp.qnn import qnn_available, qnn_unavailable_reason

    layer = tmp_path / "prefill-l00.json"  # a per-layer sweep's row: prefill layer 0 alone on the HTP
    layer.write_text(json.dumps({"schema": "kztts-placement/1", "mode": "explicit", "num_layers": 2,
                                 "prefill": {"layers": ["htp", "cpu"], "head": "cpu"},
                                 "decode": {"layers": ["cpu", "cpu"], "head": "cpu"}}))
    htp = ["--target", str(small_target), "--placements", f"prefill-htp-decode-cpu,{layer}",
           "--htp-precisions", "fp16"]
    if not qnn_available():
        print(f"no HTP row: {qnn_unavailable_reason()}")
        htp = []
    seq = tmp_path / "lm_seq"
    assert run_cli(lm_args(qwen3_dir, qwen3_bundle, seq, *htp)) == 0
    root = Path(tempfile.mkdtemp(prefix="kztts-ray-"))  # short: Ray's socket paths live under it (<= 107 bytes)
    nodes = TwoNodes(root)
    try:
        nodes.start()
        def driver(args: list[str], log: Path) -> None:
            with open(log, "w") as f:
                r = subprocess.run([sys.executable, "-m", "kztts.cli.main", *args, "--ray", nodes.address], stdout=f,
                                   stderr=subprocess.STDOUT, env=nodes.env, timeout=900, check=False)
            assert r.returncode == 0, log.read_text()[-3000:]

        lm = tmp_path / "lm_ray"
        driver(lm_args(qwen3_dir, qwen3_bundle, lm, *htp), tmp_path / "lm.log")
        tts = tmp_path / "tts_ray"
        driver(tts_args(tts, "--weights", "fp32,int8"), tmp_path / "tts.log")
    finally:
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert_same_lm_tables(seq, lm)
    report = lm_report(lm)
    ids = {n["id"] for n in report["ray"]["nodes"]}
    assert len(ids) == 2 and report["ray"]["address"] == nodes.address
    used = {u["result"]["node"]["id"] for u in units_of(lm).values()}
    assert used == ids, used  # both nodes ran units
    assert len(units_of(lm)) == 4 * (3 + 2 * bool(htp))
    if htp:
        rows = {r["name"]: r for r in report["rows"][3:]}
        assert list(rows) == ["htp-sim fp16 prefill-htp-decode-cpu", "htp-sim fp16 prefill-l00"]
        assert all(r["error"] is None and r["ms_per_token"] is None for r in rows.values()), rows
        assert rows["htp-sim fp16 prefill-l00"]["runner"] == "segments"
    assert_same_tts_tables(tts_sequential, tts)
    data = json.loads((tts / "results.json").read_text())
    assert {r["node"]["id"] for r in data["rows"]} <= ids and len(data["ray"]["nodes"]) == 2
