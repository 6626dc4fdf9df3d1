"""``kztts.core.blas``: opening a bundle's graph leaves numpy's BLAS at one thread (its small products would
otherwise wait on the cores ONNX Runtime holds)."""
from __future__ import annotations

import subprocess
import sys


def test_opening_a_graph_leaves_one_blas_thread(tmp_path):
    # a fresh process: the limit is process-wide and stays once set
    code = (
        "from threadpoolctl import threadpool_info\n"
        "import numpy\n"
        "before = [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
        "from kztts.core.blas import one_blas_thread\n"
        "one_blas_thread(); one_blas_thread()\n"
        "after = [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
        "print(before, after)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"OPENBLAS_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    before, after = out.stdout.strip().split("] [")
    assert before == "[2" and after == "1]", out.stdout

