"""Host-side token sampling: a portable PRNG and the Hugging Face logits-processor chain, in numpy.

Everything works on one float32 score vector ``[V]`` and returns a new array.

Processors (each equals its transformers counterpart, see tests/generation/test_sampling.py):

- ``repetition_penalty(scores, prev_ids, penalty, window=None)``  RepetitionPenaltyLogitsProcessor
- ``min_new_tokens(scores, step, min_tokens, eos_id)``            MinNewTokensLengthLogitsProcessor
- ``suppress_tokens(scores, ids)``                                SuppressTokensLogitsProcessor
- ``temperature(scores, t)``                                      TemperatureLogitsWarper
- ``top_k(scores, k)``                                            TopKLogitsWarper
- ``top_p(scores, p)``                                            TopPLogitsWarper

The order they run in is data, ``kztts.generation.sampling_chain.STEPS``; ``HOST_STEPS`` holds one
implementation per step name and ``choose(generator, scores, params, inputs)`` runs a
generator's whole chain: the processors (repetition penalty [-> min_new_tokens -> suppress
for the Talker]), then an exact argmax when the params are greedy, else the warpers
(temperature -> top_k -> top_p) and ``draw``. ``sample_token(scores, params, u)`` is the part
after the processors.

Determinism contract (shared with the in-graph sampler of the ``cp_frame`` graph,
``kztts.export.graphs.code_predictor_graph.sample_rows``; both pick the same token bit for bit):

- All arithmetic is float32 and every step is a fixed sequence of IEEE operations;
  ``temperature``/``top_p``/``repetition_penalty`` are rounded to float32 first. The
  top-p threshold uses ``float32(1) - float32(top_p)``, which equals transformers'
  ``1 - top_p`` rounded to float32 for any float32 ``top_p``.
- Probabilities are unnormalised ``e = exp_f32(s - max)``: a Cephes-style float32 exp
  written as plain multiply/add/floor/table-lookup steps, because numpy's and ONNX
  Runtime's exp (and their softmax sums) differ in the last bits. Sums are running
  (sequential) float32 sums in a stated order, never a library reduction.
- The *draw order* is descending processed score, ties broken by the lower token id
  (what ONNX ``TopK`` produces). Top-p accumulates in the reverse (ascending) order,
  smallest first, as transformers does, and removes ``cumsum(e) <= (1 - p) * sum(e)``
  except the top token.
- ``draw(scores, u)``: running sum ``c`` of ``e`` in draw order; the token is the first
  with ``c > u * c[-1]`` (its cumulative probability exceeds ``u``). If rounding leaves
  none, the last token with ``e > 0``: zero-probability tokens are never drawn.
- Greedy (``greedy=True``, ``temperature == 0`` or ``top_k == 1``) is ``argmax`` of the
  (penalised) scores, lowest id on ties, like numpy/torch ``argmax``.
- Temperature-scaled scores are clipped at ``+FLT_MAX`` so a tiny temperature cannot turn
  two logits into ``+inf`` and the probabilities into NaN (transformers would fail there).

``XorShift32`` is Marsaglia's 32-bit xorshift (13, 17, 5): tiny, portable, and the same
stream in any language; ``uniform()`` takes the top 24 bits, so every uniform is exactly a
float32 value in [0, 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from kztts.core.errors import KzttsError
from kztts.generation import sampling_chain
from kztts.generation.sampling_chain import PROCESSOR

FLT_MAX = np.float32(np.finfo(np.float32).max)
_NEG_INF = np.float32(-np.inf)
_ZERO_SEED_STATE = 0x9E3779B9  # xorshift state must be nonzero: seed 0 maps here
_U32 = 0xFFFFFFFF


class XorShift32:
    """Deterministic 32-bit xorshift PRNG (Marsaglia 2003, shifts 13/17/5).

    ``seed`` is any integer, reduced modulo 2**32; a zero state (seed 0, 2**32, ...) is
    replaced by the constant 0x9E3779B9 because xorshift never leaves 0.
    """

    __slots__ = ("state",)

    def __init__(self, seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise KzttsError(f"seed must be an integer, got {seed!r}")
        state = int(seed) & _U32
        self.state = state if state else _ZERO_SEED_STATE

    def next_u32(self) -> int:
        x = self.state
        x ^= (x << 13) & _U32
        x ^= x >> 17
        x ^= (x << 5) & _U32
        self.state = x
        return x

    def uniform(self) -> float:
        """Uniform in [0, 1) with 24 random bits: (x >> 8) * 2**-24 (exact in float32)."""
        return (self.next_u32() >> 8) * (1.0 / 16777216.0)

    def uniforms(self, n: int) -> np.ndarray:
        """``n`` successive ``uniform()`` values as float32 [n]."""
        return np.array([self.uniform() for _ in range(int(n))], dtype=np.float32)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one generator (Talker or Code Predictor).

    The released checkpoints' defaults are temperature 0.9, top_k 50, top_p 1.0 (and
    repetition penalty 1.05 for the Talker only); ``SamplingParams.greedy_params()`` is argmax.

    ``temperature`` >= 0 (0 = greedy), ``top_k`` >= 0 (0 = off, 1 = greedy), ``top_p`` in
    (0, 1] (1 = off), ``repetition_penalty`` > 0 (1 = off), ``greedy`` forces argmax.
    """

    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float = 1.0
    greedy: bool = False

    @classmethod
    def greedy_params(cls) -> "SamplingParams":
        return cls(temperature=0.0, top_k=1, top_p=1.0, greedy=True)

    @property
    def is_greedy(self) -> bool:
        return bool(self.greedy) or float(self.temperature) == 0.0 or int(self.top_k) == 1

    def validate(self, name_prefix: str = "") -> "SamplingParams":
        """Raise KzttsError naming the first invalid parameter and its accepted range
        (the ranges are ``kztts.generation.sampling_chain.RANGES``)."""
        for r in sampling_chain.RANGES:
            r.check(getattr(self, r.name), name_prefix)
        if not isinstance(self.greedy, (bool, np.bool_)):
            raise KzttsError(f"{name_prefix}greedy must be true or false, got {self.greedy!r}")
        return self


def _scores(scores) -> np.ndarray:
    s = np.asarray(scores)
    if s.ndim != 1:
        raise ValueError(f"scores must be a 1-D vector [V], got shape {s.shape}")
    return s.astype(np.float32, copy=True)


# ---------------------------------------------------------------- processors
def repetition_penalty(scores, prev_ids: Iterable[int], penalty: float,
                       window: Optional[int] = None) -> np.ndarray:
    """Penalise every id in ``prev_ids`` once: x / p if x > 0 else x * p.

    ``window``: only the last ``window`` ids count (None = all). ``penalty`` 1.0 is a no-op."""
    s = _scores(scores)
    ids = np.asarray(list(prev_ids) if not isinstance(prev_ids, np.ndarray) else prev_ids, dtype=np.int64)
    ids = ids.reshape(-1)
    if window is not None:
        ids = ids[-int(window):] if window > 0 else ids[:0]
    if ids.size == 0:
        return s
    p = np.float32(penalty)
    idx = np.unique(ids)
    v = s[idx]
    s[idx] = np.where(v < 0, v * p, v / p)
    return s


def min_new_tokens(scores, step: int, min_tokens: int, eos_id) -> np.ndarray:
    """EOS id(s) -> -inf while fewer than ``min_tokens`` tokens were generated (``step`` < min)."""
    s = _scores(scores)
    if step < min_tokens:
        s[np.asarray(eos_id, dtype=np.int64).reshape(-1)] = _NEG_INF
    return s


CONTROL_IDS = 1024  # the Talker vocabulary's last 1024 ids are control ids (EOS among them)


def control_ids(vocab: int, keep: int | None = None) -> np.ndarray:
    """The Talker's control ids (suppressed when choosing CB0), less ``keep`` (EOS, when it may stop)."""
    ids = np.arange(vocab - CONTROL_IDS, vocab)
    return ids if keep is None else ids[ids != keep]


def suppress_tokens(scores, ids) -> np.ndarray:
    """The given ids -> -inf."""
    s = _scores(scores)
    idx = np.asarray(ids, dtype=np.int64).reshape(-1)
    if idx.size:
        s[idx] = _NEG_INF
    return s


def temperature(scores, t: float) -> np.ndarray:
    """scores / t (t > 0), in float32."""
    return _scores(scores) / np.float32(t)


def top_k(scores, k: int) -> np.ndarray:
    """Keep every score >= the k-th largest (ties at the k-th value are all kept); 0 = off."""
    s = _scores(scores)
    k = int(k)
    if k <= 0 or k >= s.size:
        return s
    kth = np.partition(s, s.size - k)[s.size - k]
    s[s < kth] = _NEG_INF
    return s


def draw_order(scores) -> np.ndarray:
    """Token ids by descending score, ties by lower id (ONNX TopK order)."""
    s = np.asarray(scores, dtype=np.float32)
    return np.argsort(-s, kind="stable")


# exp(x) for x <= 0 as a fixed sequence of float32 IEEE operations (Cephes expf: Cody-Waite
# reduction x = n ln2 + r, polynomial in r, times 2**n read from a table). numpy's and ONNX
# Runtime's own exp differ in the last bits; with this sequence the host sampler and the
# cp_frame graph compute bit-identical probabilities, hence draw identical tokens.
EXP_MIN = np.float32(-87.0)  # below: 0 (e**-87 ~ 1.6e-38 next to the top token's 1)
EXP_LOG2E = np.float32(1.44269504088896341)
EXP_C1 = np.float32(0.693359375)
EXP_C2 = np.float32(-2.12194440e-4)
EXP_POLY = tuple(np.float32(c) for c in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                          4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
POW2_NEG = np.array([2.0 ** -i for i in range(128)], dtype=np.float32)  # 2**-i, exact


def exp_f32(x) -> np.ndarray:
    """exp(x) for x <= 0 in float32 (~1 ulp), 0 where x < -87 (so -inf -> 0)."""
    x = np.asarray(x, dtype=np.float32)
    xc = np.maximum(x, EXP_MIN)
    n = np.floor(xc * EXP_LOG2E + np.float32(0.5))
    r = xc - n * EXP_C1
    r = r - n * EXP_C2
    z = r * r
    y = np.full_like(r, EXP_POLY[0])
    for c in EXP_POLY[1:]:
        y = y * r + c
    y = y * z + r + np.float32(1.0)
    e = y * POW2_NEG[(-n).astype(np.int64)]
    return np.where(x < EXP_MIN, np.float32(0.0), e).astype(np.float32, copy=False)


def top_p(scores, p: float, min_tokens_to_keep: int = 1) -> np.ndarray:
    """Nucleus filter with transformers' TopPLogitsWarper semantics; skipped at p >= 1.

    Ascending order (the reverse of the draw order), cumulative probability, remove where it
    is <= 1 - p, always keep the ``min_tokens_to_keep`` largest. The cumulative probability
    is compared unnormalised, ``cumsum(e) <= (1 - p) * sum(e)`` with ``e = exp_f32(s - max)``
    and the sum accumulated in the same ascending order."""
    s = _scores(scores)
    p32 = np.float32(p)
    if p32 >= 1:
        return s
    asc = draw_order(s)[::-1]
    sorted_s = s[asc]
    with np.errstate(over="ignore"):  # -FLT_MAX - FLT_MAX -> -inf -> probability 0
        cum = np.cumsum(exp_f32(sorted_s - sorted_s[-1]), dtype=np.float32)
    remove = cum <= (np.float32(1) - p32) * cum[-1]
    if min_tokens_to_keep > 0:
        remove[-min_tokens_to_keep:] = False
    s[asc[remove]] = _NEG_INF
    return s


def draw(scores, u: float) -> int:
    """Inverse-CDF draw: the first token in draw order whose cumulative probability exceeds ``u``.

    With ``e = exp_f32(s - max)`` in draw order and ``c = cumsum(e)`` (float32, in order), the
    token at position ``min(count(c <= u * c[-1]), count(e > 0) - 1)``: never one of zero
    probability, even when rounding leaves ``u * c[-1] >= c[-1]``."""
    s = np.asarray(scores, dtype=np.float32)
    order = draw_order(s)
    sorted_s = s[order]
    with np.errstate(over="ignore"):
        e = exp_f32(sorted_s - sorted_s[0])
    cum = np.cumsum(e, dtype=np.float32)
    n = int(np.count_nonzero(cum <= np.float32(u) * cum[-1]))
    last = int(np.count_nonzero(e > 0)) - 1
    return int(order[min(n, max(last, 0))])


def argmax(scores) -> int:
    """Greedy choice: the highest score, lowest id on ties."""
    return int(np.argmax(np.asarray(scores, dtype=np.float32)))


def _clipped_temperature(scores, t: float) -> np.ndarray:
    with np.errstate(over="ignore"):  # x / tiny t -> inf, clipped just below
        return np.minimum(temperature(scores, t), FLT_MAX)


# ---------------------------------------------------------------- the chain
@dataclass(frozen=True)
class ChainInputs:
    """The per-call values the steps read besides the ``SamplingParams`` (a step's ``context``).

    ``u``: the uniform of the draw; ``history``: ids drawn before (the Talker's CB0s, or the
    frame's codes so far); ``window``: only the last ``window`` of them count (None = all);
    ``step``: tokens generated so far; ``min_new_tokens``/``eos_id``: EOS is blocked while
    ``step < min_new_tokens``; ``suppress``: ids never drawn."""

    u: float
    history: Sequence[int] | np.ndarray = ()
    window: Optional[int] = None
    step: int = 0
    min_new_tokens: int = 0
    eos_id: int | Sequence[int] = ()
    suppress: Sequence[int] | np.ndarray = ()


HostStep = Callable[[np.ndarray, SamplingParams, ChainInputs], "np.ndarray | int"]

# One numpy implementation per step name of kztts.generation.sampling_chain.STEPS; "draw" returns the token.
HOST_STEPS: dict[str, HostStep] = {
    "repetition_penalty": lambda s, p, c: repetition_penalty(s, c.history, p.repetition_penalty, c.window),
    "min_new_tokens": lambda s, p, c: min_new_tokens(s, c.step, c.min_new_tokens, c.eos_id),
    "suppress": lambda s, p, c: suppress_tokens(s, c.suppress),
    "temperature": lambda s, p, c: _clipped_temperature(s, p.temperature),
    "top_k": lambda s, p, c: top_k(s, p.top_k),
    "top_p": lambda s, p, c: top_p(s, p.top_p),
    "draw": lambda s, p, c: draw(s, c.u),
}
_HOST_SIDE = "host (kztts.generation.sampling.HOST_STEPS)"
for _generator in sampling_chain.GENERATORS:  # a step without a host implementation fails the import
    sampling_chain.implementations(sampling_chain.chain(_generator), HOST_STEPS, _HOST_SIDE)


def run_steps(steps: Sequence[sampling_chain.Step], scores, params: SamplingParams, inputs: ChainInputs) -> int:
    """Run ``steps`` (a chain or its tail, ending with the draw) on ``scores``; greedy params
    stop at the first step that is not a processor and take the argmax there."""
    s = scores
    for step, run in zip(steps, sampling_chain.implementations(steps, HOST_STEPS, _HOST_SIDE)):
        if step.kind != PROCESSOR and params.is_greedy:
            return argmax(s)
        s = run(s, params, inputs)
    return int(s)


def choose(generator: str, scores, params: SamplingParams, inputs: ChainInputs) -> int:
    """One token from ``scores`` [V] with the chain of ``generator`` ("talker" or "code_predictor")."""
    return run_steps(sampling_chain.chain(generator), scores, params, inputs)


def sample_token(scores, params: SamplingParams, u: float) -> int:
    """The Code Predictor chain after its processors: temperature -> top_k -> top_p -> draw on
    ``u`` (or argmax when greedy). The caller applies the processors before it."""
    steps = sampling_chain.chain("code_predictor")
    first = next(i for i, step in enumerate(steps) if step.kind != PROCESSOR)
    return run_steps(steps[first:], scores, params, ChainInputs(u=u))
