"""numpy's BLAS at one thread in a process that runs graphs.

The runtime's own products are small (the text projection of a prompt's few rows, 2048 x 2048 at 0.6B) and run
between ONNX Runtime calls. OpenBLAS splits even these over its threads, which then wait on cores that ONNX
Runtime's threads hold: measured on 2 cores, a prompt's projection took 8-80 ms with 2 BLAS threads and 3.5 ms
with one (the random-weight 0.6B, `benchmarks/ttfa/written_ttfa.py`), straight into the time to first audio.
"""
from __future__ import annotations

import threading

from threadpoolctl import threadpool_limits

_lock = threading.Lock()
_limited = False


def one_blas_thread() -> None:
    """Limit numpy's BLAS to one thread for the rest of the process (once; later calls do nothing)."""
    global _limited
    with _lock:
        if _limited:
            return
        threadpool_limits(1, user_api="blas")
        _limited = True


__all__ = ["one_blas_thread"]
