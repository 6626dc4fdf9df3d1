"""Prefill on the HTP, decode on the CPU (the "option C" of an earlier port): a ``TalkerRunner``.

The prompt is the one place where the HTP's throughput pays most (many positions per
weight read); decode is one position per frame and bandwidth-bound, where the CPU in
fp32 is exact. After the HTP prefill (``kztts.runners.talker_static.StaticTalker``) its KV
cache, keys transposed in the HTP layout, is handed to the CPU Talker's cache
(``kztts.runners.talker.Talker``) and decoding continues there. The handed-over entries are
the HTP's own fp16 results, not a CPU recomputation (``handed_over`` keeps a copy for
inspection).
"""
from __future__ import annotations

import abc

import numpy as np

from kztts.core.errors import KzttsError
from kztts.runners.talker import Talker
from kztts.runners.talker_static import StaticTalker


class Handover(abc.ABC):
    """Prefill on one runner (the HTP's), decode on another (the CPU's): what every handover shares. A subclass's
    ``prefill`` runs the prompt on ``prefill_talker`` and moves its cache into ``decode_talker``."""

    def __init__(self, prefill_talker, decode_talker, keep_handover: bool = False):
        if prefill_talker.num_layers != decode_talker.num_layers:
            raise KzttsError("prefill and decode talkers have different layer counts")
        self.prefill_talker, self.decode_talker = prefill_talker, decode_talker
        self.num_layers = decode_talker.num_layers
        self.hidden_size = decode_talker.hidden_size
        self.vocab = decode_talker.vocab
        self.keep_handover = keep_handover
        self.handed_over = None  # with keep_handover: a copy of what the last prefill handed over

    @property
    def position(self) -> int:
        return self.decode_talker.position

    @property
    def context(self) -> int:
        return min(self.prefill_talker.context, self.decode_talker.context)

    @property
    def guard(self):
        """The HTP prefill's fp16 guard (``kztts.htp.saturation``), if it has one."""
        return self.prefill_talker.guard

    def reset(self) -> None:
        self.prefill_talker.reset()
        self.decode_talker.reset()

    @abc.abstractmethod
    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The prompt on ``prefill_talker``, its cache then moved into ``decode_talker``'s."""

    def decode(self, embed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.decode_talker.position == 0:
            raise KzttsError("decode called before prefill")
        return self.decode_talker.decode(embed)

    def extend(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """More positions after the handover (a chat's next turn): on the CPU; a first call prefills."""
        if self.decode_talker.position == 0:
            return self.prefill(embeds)
        return self.decode_talker.extend(embeds)


class HandoverTalker(Handover):
    """``prefill`` on the static HTP Talker, then its KV to the CPU Talker for ``decode``."""

    prefill_talker: StaticTalker
    decode_talker: Talker

    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The prompt on the HTP; its KV is then moved into the CPU cache."""
        cache = self.decode_talker.kv
        cache.reset()
        cache.check_room(embeds.shape[0])  # before the HTP work, not after it
        result = self.prefill_talker.prefill(embeds)
        p = self.prefill_talker.length
        keys, values = self.prefill_talker.float_kv(p)  # [1, kv, p, hd] float32, whatever the HTP KV type
        cache.append(keys, values)
        if self.keep_handover:
            self.handed_over = [(k.copy(), v.copy()) for k, v in zip(keys, values)]
        return result
