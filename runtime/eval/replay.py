"""Teacher forcing of the Talker, and the greedy CB0 choice of validation and calibration runs.

Validation, benchmarks and calibration feed the Talker given codes instead of its own
choices, so two runs (CPU and HTP, fp32 and int8, kztts and qwen-tts) see the very same
inputs and their logits compare step by step. The decode input after frame k is the frame's
summed codec embedding plus the prompt's k-th trailing text row (``tts_pad`` past them), as
in the frame loop.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from kztts.bundle.embeddings import EmbeddingTables
from kztts.generation import sampling
from kztts.tts.prompt import Prompt


def decode_input(tables: EmbeddingTables, prompt: Prompt, frame: np.ndarray, k: int) -> np.ndarray:
    """The Talker's decode input after frame ``k`` (16 codes): f32 [H]."""
    return (tables.codec_sum(frame) + prompt.text_after(k)).astype(np.float32)


def decode_inputs(tables: EmbeddingTables, prompt: Prompt, codes: np.ndarray) -> np.ndarray:
    """The decode inputs after every frame of ``codes`` [F, 16]: f32 [F, H]."""
    rows = [decode_input(tables, prompt, frame, k) for k, frame in enumerate(codes)]
    return np.asarray(rows, np.float32).reshape(-1, tables.hidden)


def teacher_forced_talker(talker, prefill_embeds: np.ndarray,
                          decode_embeds: Iterable[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Prefill, then one decode per row of ``decode_embeds``: logits [F, V] and hidden [F, H],
    row 0 after the prefill (F = 1 + the decode rows). ``talker``: any Talker runner."""
    logits, hidden = talker.prefill(prefill_embeds)
    out_l, out_h = [logits], [hidden]
    for e in decode_embeds:
        logits, hidden = talker.decode(e)
        out_l.append(logits)
        out_h.append(hidden)
    return np.stack(out_l), np.stack(out_h)


def greedy_cb0(logits: np.ndarray, eos_id: int, *, history: Iterable[int] = (), repetition_penalty: float = 1.0,
               allow_eos: bool = False) -> int:
    """Greedy CB0 in the frame loop's processor order: repetition penalty over ``history``,
    control ids suppressed (EOS too unless ``allow_eos``: the sequence keeps going), argmax."""
    vocab = int(np.shape(logits)[-1])
    s = sampling.repetition_penalty(logits, list(history), repetition_penalty)
    s = sampling.suppress_tokens(s, sampling.control_ids(vocab, keep=eos_id if allow_eos else None))
    return sampling.sample_token(s, sampling.SamplingParams.greedy_params(), 0.0)
