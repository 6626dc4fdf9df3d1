"""HTP graphs in host processes (``kztts.htp.hosts``): a target's ``process_context_mb`` spreads
them over child processes; the results equal one process's, and a dead host is a clear error."""
from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from kztts.core.errors import KzttsError

PROMPT = "Hello, how are you? Bonjour 你好"
BUDGET_MB = 0.4  # the tiny Qwen3's layer graphs are 0.17 MB, its heads 0.10 MB: three hosts


@pytest.fixture(scope="module")
def qnn_ep():
    """Skips when the QNN execution provider cannot run here (before any bundle is built)."""
    from kztts.htp.qnn import qnn_available, qnn_unavailable_reason

    if not qnn_available():
        pytest.skip(f"no QNN execution provider: {qnn_unavailable_reason()}")


@pytest.fixture(scope="module")
def bundle(qnn_ep, qwen3_bundle):
    """The tiny Qwen3's LM bundle with the static and layer graphs of the small simulator target."""
    return qwen3_bundle


@pytest.fixture(scope="module")
def hosted_target(small_target, tmp_path_factory):
    data = json.loads(small_target.read_text())
    data["process_context_mb"] = BUDGET_MB
    p = tmp_path_factory.mktemp("hosts") / "simulator_small_hosted.json"
    p.write_text(json.dumps(data, indent=1))
    return p


def _ids(bundle) -> list[int]:
    from kztts.lm.lm import LM

    cpu = LM(bundle)
    cpu.stop_ids = frozenset()
    list(cpu.generate(PROMPT, 6, greedy=True))
    return list(cpu.history)


def _feed(lm, ids: list[int]) -> list[np.ndarray]:
    lm._claim(object())
    return [lm.feed(ids[:-3])] + [lm.feed([t]) for t in ids[-3:]]


def test_hosted_graphs_equal_one_process(bundle, small_target, hosted_target):
    """all-htp on the layer graphs, strict, with the fp16 guard on: the graphs spread over three
    host processes of at most 0.4 MB each give the logits of one process, bit for bit."""
    from kztts.htp.hosts import HostedSession
    from kztts.lm.lm import LM

    ids = _ids(bundle)
    one = LM(bundle, target=small_target, placement="all-htp", strict=True)
    assert one.plan.hosts is None
    ref = _feed(one, ids)
    hosted = LM(bundle, target=hosted_target, placement="all-htp", strict=True)
    got = _feed(hosted, ids)
    hosts = hosted.plan.hosts.summary()
    print("hosts:", hosts)
    assert len(hosts) == 3 and all(h["mb"] <= BUDGET_MB for h in hosts)
    assert "host processes of at most 0.4 MB of graph files each" in hosted.plan.table()
    assert "host processes" not in one.plan.table()
    assert len({h["pid"] for h in hosts} | {os.getpid()}) == 4
    opened = [g for h in hosts for g in h["graphs"]]
    assert sorted(opened) == sorted(n for n in hosted.runner.sessions) and len(opened) == 6
    assert all(isinstance(s, HostedSession) for s in hosted.runner.sessions.values())
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    hosted.plan.hosts.close()


@pytest.mark.parametrize("placement, runner", [(None, "static"), ("prefill-htp-decode-cpu", "handover")])
def test_whole_stack_graphs_in_hosts(bundle, small_target, tmp_path, placement, runner):
    """The whole-stack static graphs (0.42 MB each) in two hosts of 0.6 MB: the static runner (its decode
    step passes arrays: a hosted session has no IO binding) and the KV handover give one process's logits."""
    from kztts.lm.lm import LM

    data = json.loads(small_target.read_text())
    data["process_context_mb"] = 0.6
    target = tmp_path / "hosted.json"
    target.write_text(json.dumps(data))
    ids = _ids(bundle)
    ref = _feed(LM(bundle, target=small_target, placement=placement, strict=True, check_saturation=False), ids)
    lm = LM(bundle, target=target, placement=placement, strict=True, check_saturation=False)
    assert lm.plan.runner == runner
    got = _feed(lm, ids)
    hosts = lm.plan.host_summary()
    assert [h["graphs"] for h in hosts] == [["talker_prefill"], ["talker_decode"]]  # the handover's tail too
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    lm.plan.close()
    assert lm.plan.host_summary() == []


def test_a_dead_host_is_a_clear_error(bundle, hosted_target):
    """A host killed under the runtime (the OOM killer's signal) fails the next call naming the
    host, the signal and the graphs it held; no hang, no traceback from inside the pipe."""
    from kztts.htp.hosts import HostError
    from kztts.lm.lm import LM

    lm = LM(bundle, target=hosted_target, placement="all-htp", strict=True)
    host = lm.plan.hosts.hosts[1]
    os.kill(host.proc.pid, signal.SIGKILL)
    host.proc.join(10)
    with pytest.raises(HostError, match=r"HTP host process 1 .* died \(killed by signal 9 \(out of memory\?\)\) "
                                        r"while running talker_prefill_head; it held talker_prefill_head"):
        _feed(lm, _ids(bundle))
    lm.plan.hosts.close()


def test_a_graph_larger_than_the_budget_is_refused(bundle, small_target):
    """A graph that cannot fit one process is refused before anything starts, with what to do."""
    from kztts.bundle.bundle import Bundle
    from kztts.htp.hosts import HtpHosts
    from kztts.htp.targets import load_target

    hosts = HtpHosts(Bundle.open(bundle, load_graphs=False), load_target(small_target), True, 0.1)
    with pytest.raises(KzttsError, match=r"talker_prefill_layer_0: its HTP graph files take 0.16\d+ MB, more than one "
                                         r"process may open \(0.1 MB, process_context_mb of target"):
        hosts.open("talker_prefill_layer_0")
    assert hosts.hosts == []


_PARENT_SCRIPT = """
import multiprocessing as mp, sys, time
from kztts.htp.hosts import _exit_with_parent

def child():  # a host inside a long call
    _exit_with_parent()
    time.sleep(60)

if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=child, daemon=True)
    p.start()
    print(p.pid, flush=True)
    time.sleep(120)
"""


def test_a_host_ends_with_its_parent_even_inside_a_call(tmp_path):
    """A parent killed by a signal never closes its hosts, and a host inside a long simulated call
    would only see the closed pipe when the call returns: its watcher ends it within seconds. The
    "call" here is a 60 s sleep in a spawned child; its parent is killed."""
    import subprocess
    import sys
    import time

    import psutil

    script = tmp_path / "parent.py"
    script.write_text(_PARENT_SCRIPT)
    def alive(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE  # an orphan ended but not yet reaped counts as gone
        except psutil.NoSuchProcess:
            return False

    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    host = None
    try:
        host = psutil.Process(int(parent.stdout.readline()))
        time.sleep(1.0)
        assert alive(host)  # a live parent keeps it
        parent.kill()
        parent.wait()
        started = time.monotonic()
        while alive(host) and time.monotonic() - started < 20:
            time.sleep(0.1)
        assert not alive(host), "the host outlived its parent"
        assert time.monotonic() - started < 5
    finally:
        if parent.poll() is None:
            parent.kill()
        if host is not None and alive(host):
            host.kill()
