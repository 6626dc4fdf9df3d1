"""kztts.core.worker_process: a piece of work in a fresh Python process, its result (arrays included) back."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from kztts.core.worker_process import WorkerError, run_worker

CHILD = textwrap.dedent('''
    import os, signal, sys, time

    from kztts.core.worker_process import worker_main


    def work(spec):
        mode = spec["mode"]
        if mode == "fail":
            raise ValueError("bad spec value 7")
        if mode == "signal":
            os.kill(os.getpid(), getattr(signal, spec["signal"]))
        if mode == "sleep":
            time.sleep(30)
        return {"sum": float(spec["x"].sum()), "twice": spec["x"] * 2, "info": {"n": spec["n"], "mode": mode}}


    if __name__ == "__main__":
        if sys.argv[1:] and "silent" in open(sys.argv[1]).read():
            sys.exit(0)  # exits fine without writing a result
        sys.exit(worker_main(work))
''')


@pytest.fixture()
def child(tmp_path):
    """A worker module importable by the child (``env`` adds its folder to PYTHONPATH)."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "kztts_test_child.py").write_text(CHILD)
    return {"PYTHONPATH": str(tmp_path / "mods")}


def test_a_child_result_comes_back_with_its_arrays(child, tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = run_worker("kztts_test_child", {"mode": "ok", "x": x, "n": 3}, tmp_path, "ok", env=child)
    assert out["sum"] == 15.0 and out["info"] == {"n": 3, "mode": "ok"}
    assert out["twice"].dtype == np.float32 and np.array_equal(out["twice"], x * 2)
    assert set(out) == {"sum", "twice", "info"}
    for name in ("ok.spec.json", "ok.spec.npz", "ok.result.json", "ok.result.npz"):
        assert (tmp_path / name).is_file(), name
    # no work folder: a temporary one, the arrays still come back
    again = run_worker("kztts_test_child", {"mode": "ok", "x": x, "n": 1}, None, "tmp", env=child)
    assert np.array_equal(again["twice"], x * 2)


def test_a_failing_child_names_the_worker_and_its_error(child, tmp_path):
    with pytest.raises(WorkerError) as e:
        run_worker("kztts_test_child", {"mode": "fail"}, tmp_path, "bad", env=child)
    msg = str(e.value)
    assert msg.startswith("the worker kztts_test_child [bad] failed (exit 1):")
    assert "ValueError: bad spec value 7" in msg and e.value.signal is None
    assert e.value.brief().endswith("ValueError: bad spec value 7")
    with pytest.raises(WorkerError, match=r"\[quiet\] failed \(it wrote no result\)"):
        run_worker("kztts_test_child", {"mode": "silent"}, tmp_path, "quiet", env=child)


@pytest.mark.parametrize("sig, number, note", [("SIGKILL", 9, "killed by signal 9 (out of memory?)"),
                                               ("SIGTERM", 15, "killed by signal 15")])
def test_a_child_killed_by_a_signal_says_which(child, tmp_path, sig, number, note):
    with pytest.raises(WorkerError) as e:
        run_worker("kztts_test_child", {"mode": "signal", "signal": sig}, tmp_path, "killed", env=child)
    assert e.value.signal == number
    assert str(e.value) == f"the worker kztts_test_child [killed] failed ({note})"
    assert e.value.brief() == note


def test_a_child_past_its_timeout_is_stopped(child, tmp_path):
    with pytest.raises(WorkerError, match=r"\[slow\] failed \(timed out after 0.5 s\)"):
        run_worker("kztts_test_child", {"mode": "sleep"}, tmp_path, "slow", env=child, timeout=0.5)
