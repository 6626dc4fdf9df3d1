"""The sampling chains as data: the ordered steps the Talker (CB0) and the Code Predictor
(CB1..15) apply to their logits, and the accepted range of every sampling setting.

Both samplers iterate this description: the host one (``kztts.generation.sampling.choose``, with one
numpy implementation per step name in ``kztts.generation.sampling.HOST_STEPS``) and the in-graph one of
the ``cp_frame`` graph (``kztts.export.graphs.code_predictor_graph.sample_rows``, generated at export
from the Code Predictor's chain with one torch implementation per step name in
``GRAPH_STEPS``). Each side refuses, at import and when it runs a chain, a step it has no
implementation for. A new step is one ``Step`` entry in ``STEPS`` plus its implementation on
each side (and, if it reads a new setting, one ``SettingRange`` in ``RANGES``, a
``SamplingParams`` field and a ``cp_frame`` input).

Step kinds follow transformers: a *processor* applies always (greedy decoding too), a
*warper* only when sampling, and the last step, the *draw*, picks the token. Greedy decoding
is the argmax of the scores after the last processor (see ``kztts.generation.sampling``'s contract).
This module holds the description only; the runtime and the export both import it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from kztts.core.errors import KzttsError

PROCESSOR, WARPER, DRAW = "processor", "warper", "draw"
GENERATORS = ("talker", "code_predictor")

_INT = (int, np.integer)
_REAL = (int, float, np.integer, np.floating)


@dataclass(frozen=True)
class SettingRange:
    """The accepted values of one ``SamplingParams`` field, checked in exactly one place.

    ``rule`` completes ``SamplingParams.validate``'s "<field> must be ..." message,
    ``expected`` the flag / environment message "expected ..."; ``env`` names the overrides
    ``KZTTS_<env>`` (Talker) and ``KZTTS_CP_<env>`` (Code Predictor)."""

    name: str
    integer: bool
    ok: Callable[[float], bool]
    rule: str
    expected: str
    env: str

    def check(self, value, prefix: str = ""):
        """Return ``value``; raise KzttsError naming ``prefix + name`` when its type or range is wrong."""
        kind = _INT if self.integer else _REAL
        if isinstance(value, bool) or not isinstance(value, kind):
            what = "an integer" if self.integer else "a number"
            raise KzttsError(f"{prefix}{self.name} must be {what}, got {value!r}")
        if not self.ok(value):
            raise KzttsError(f"{prefix}{self.name} must be {self.rule}, got {value!r}")
        return value

    def parse(self, source: str, raw) -> float | int:
        """Parse and range-check a flag or environment value; ``source`` names it in the error."""
        try:
            value = int(raw) if self.integer else float(raw)
        except (TypeError, ValueError):
            raise KzttsError(f"{source}={raw!r} is not valid: expected {self.expected}") from None
        if not self.ok(value):
            raise KzttsError(f"{source}={raw!r} is out of range: expected {self.expected}")
        return value


# In SamplingParams' field order, which is also the order validation reports the first error in.
RANGES: tuple[SettingRange, ...] = (
    SettingRange("temperature", False, lambda v: math.isfinite(float(v)) and v >= 0,
                 "a finite number >= 0 (0 = greedy)", "a number >= 0 (0 = greedy)", "TEMP"),
    SettingRange("top_k", True, lambda v: v >= 0,
                 "an integer >= 0 (0 = disabled, 1 = greedy)", "an integer >= 0 (0 = off)", "TOPK"),
    SettingRange("top_p", False, lambda v: 0.0 < float(v) <= 1.0,
                 "in (0, 1] (1 = disabled)", "a number in (0, 1]", "TOPP"),
    SettingRange("repetition_penalty", False, lambda v: math.isfinite(float(v)) and v > 0,
                 "a finite number > 0 (1 = off)", "a number > 0 (1 = off)", "REPP"),
)


def setting_range(name: str) -> SettingRange:
    """The ``SettingRange`` of a ``SamplingParams`` field."""
    for r in RANGES:
        if r.name == name:
            return r
    raise KeyError(f"no sampling setting {name!r}; known: {', '.join(r.name for r in RANGES)}")


@dataclass(frozen=True)
class Step:
    """One entry of the chain.

    ``params``: the ``SamplingParams`` fields it reads (each has a ``SettingRange``; in the
    ``cp_frame`` graph each is an input of the same name). ``context``: the per-call values it
    reads (attributes of ``kztts.generation.sampling.ChainInputs``). ``talker`` / ``code_predictor``:
    whether that generator's chain has it."""

    name: str
    kind: str
    params: tuple[str, ...] = ()
    context: tuple[str, ...] = ()
    talker: bool = True
    code_predictor: bool = True


# The reference order (transformers' processors, then its warpers, then the draw).
STEPS: tuple[Step, ...] = (
    Step("repetition_penalty", PROCESSOR, ("repetition_penalty",), ("history", "window")),
    Step("min_new_tokens", PROCESSOR, (), ("step", "min_new_tokens", "eos_id"), code_predictor=False),
    Step("suppress", PROCESSOR, (), ("suppress",), code_predictor=False),
    Step("temperature", WARPER, ("temperature",)),
    Step("top_k", WARPER, ("top_k",)),
    Step("top_p", WARPER, ("top_p",)),
    Step("draw", DRAW, (), ("u",)),
)


def check_order(steps: Sequence[Step]) -> tuple[Step, ...]:
    """Processors, then warpers, then exactly one draw, last; unique names; known settings."""
    steps = tuple(steps)
    names = [s.name for s in steps]
    rank = {PROCESSOR: 0, WARPER: 1, DRAW: 2}
    for s in steps:
        if s.kind not in rank:
            raise ValueError(f"sampling step {s.name!r} has kind {s.kind!r}; expected one of {', '.join(rank)}")
        for p in s.params:
            setting_range(p)
    kinds = [rank[s.kind] for s in steps]
    if len(set(names)) != len(names) or kinds != sorted(kinds) or kinds.count(2) != 1 or kinds[-1] != 2:
        raise ValueError(f"sampling chain {names} must list unique steps: processors, then warpers, "
                         "then one draw, last")
    return steps


def chain(generator: str, steps: Optional[Sequence[Step]] = None) -> tuple[Step, ...]:
    """The ordered steps of ``generator`` ("talker" or "code_predictor"), from ``STEPS`` unless given."""
    if generator not in GENERATORS:
        raise ValueError(f"unknown generator {generator!r}; expected one of {', '.join(GENERATORS)}")
    return check_order(s for s in (STEPS if steps is None else steps) if getattr(s, generator))


def implementations(steps: Sequence[Step], registry: Mapping[str, Callable], side: str) -> tuple[Callable, ...]:
    """Each step's implementation in ``registry``; NotImplementedError naming the first step ``side`` lacks."""
    missing = [s.name for s in steps if s.name not in registry]
    if missing:
        raise NotImplementedError(f"sampling step {missing[0]!r} has no {side} implementation: add one "
                                  f"keyed {missing[0]!r} (see kztts.generation.sampling_chain)")
    return tuple(registry[s.name] for s in steps)
