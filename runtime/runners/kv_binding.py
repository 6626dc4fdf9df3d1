"""The static decode graph bound once to host buffers (``ort.IOBinding``).

``kztts.runners.talker_static.StaticTalker`` binds its whole KV cache as the decode graph's past
inputs, small per-step input buffers it fills in place, and preallocated outputs the graph
writes into: no array is passed per call, and ONNX Runtime reads the cache where it lies.

HTP shared memory (``enable_htp_shared_memory_allocator`` in a target's provider options):
on a device the QNN EP can hand out rpcmem buffers the NPU reads without a copy.
:func:`kv_buffers` allocates the cache through it when the session offers that allocator.
NOT VERIFIED HERE: the x86-64 simulator refuses the option when the session is created
(onnxruntime-qnn 2.7.0 cannot load ``libcdsprpc.so``: "Unknown exception occurred while
creating QNN EP"), so that branch has only run as far as its fallback to host memory.
"""
from __future__ import annotations

import ctypes
import logging

import numpy as np
import onnxruntime as ort

log = logging.getLogger(__name__)

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32}
SHARED_MEMORY_OPTION = "enable_htp_shared_memory_allocator"


def _arg_buffers(args) -> dict[str, np.ndarray]:
    out = {}
    for a in args:
        if not all(isinstance(d, int) for d in a.shape):
            raise ValueError(f"IO binding needs static shapes; {a.name} is {a.shape}")
        out[a.name] = np.zeros(a.shape, _ORT_TYPES[a.type])
    return out


def wants_shared_memory(session) -> bool:
    """True when the session's QNN EP was created with the HTP shared-memory allocator."""
    try:
        opts = session.get_provider_options()
    except AttributeError:
        return False
    return any(str(o.get(SHARED_MEMORY_OPTION, "0")) == "1" for o in opts.values())


def _shared_buffer(session, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, ort.OrtValue]:
    """DEVICE ONLY, NOT VERIFIED HERE: an OrtValue from the session's QNN HTP shared-memory allocator
    (host-accessible rpcmem) and a numpy view of its memory, so host writes need no copy."""
    value = session.create_ortvalue_from_shape_and_type(list(shape), dtype, "cpu", 0,
                                                        ort.OrtDeviceVendorId.QUALCOMM)
    count = int(np.prod(shape))
    raw = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(value.data_ptr())
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape), value


def kv_buffers(session, shapes: list[tuple[int, ...]], dtype, fill) -> tuple[list[np.ndarray], list]:
    """Host KV buffers of ``shapes`` filled with ``fill``: from the HTP shared-memory allocator when
    the session offers it (device only, see the module docstring), else plain numpy arrays.
    Returns (arrays, OrtValues that own shared memory: keep them alive with the arrays)."""
    dtype = np.dtype(dtype)
    if wants_shared_memory(session):
        try:
            pairs = [_shared_buffer(session, s, dtype) for s in shapes]
            for a, _ in pairs:
                a[...] = fill
            return [a for a, _ in pairs], [v for _, v in pairs]
        except Exception as exc:  # the allocator is missing (simulator, old EP): host memory works anyway
            log.warning("HTP shared-memory KV buffers unavailable (%s); using host memory",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return [np.full(s, fill, dtype) for s in shapes], []


class DecodeBinding:
    """One graph's inputs and outputs bound once: ``inputs``/``outputs`` are the host buffers by name
    (the ``bound`` ones given by the caller, e.g. the KV cache, the rest allocated here from the
    graph's static shapes); fill the inputs in place, then ``run()``."""

    def __init__(self, session, bound: dict[str, np.ndarray], kv_inputs: list[str], kv_outputs: list[str]):
        self.session = session
        self.inputs = _arg_buffers(a for a in session.get_inputs() if a.name not in bound)
        self.inputs.update(bound)
        self.outputs = _arg_buffers(session.get_outputs())
        self.binding = session.io_binding()
        self._values = []  # the OrtValues the binding refers to (they view the numpy buffers)
        for name, arr in self.inputs.items():
            v = ort.OrtValue.ortvalue_from_numpy(arr)
            self.binding.bind_ortvalue_input(name, v)
            self._values.append(v)
        for name, arr in self.outputs.items():
            v = ort.OrtValue.ortvalue_from_numpy(arr)
            self.binding.bind_ortvalue_output(name, v)
            self._values.append(v)
        # KV bytes crossing the graph boundary per call: the bound past inputs and the new outputs
        self.kv_bytes = sum(self.inputs[n].nbytes for n in kv_inputs) + sum(self.outputs[n].nbytes for n in kv_outputs)

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)
