"""The Talker's keys and values of a voice's prompt prefix, computed once and reused.

A prompt starts with positions that depend on the voice and the language only: the role and the
codec prefix with the speaker vector (``Prompt.voice_positions``; 9 with a language tag and an
x-vector). ``VoicePrefixes.prefill`` always runs a prompt as two Talker calls, that prefix then the
text, and keeps the prefix's keys/values per prefix (keyed by the bytes of its embeddings); a later
prompt with the same prefix restores them instead of recomputing. Because the split is the same
whether the prefix was cached or not, a cached run gives the very codes an uncached one gives; against
one whole prefill they agree up to float rounding: equal on fp32 graphs (measured), not on MatMulNBits
int4/int8 ones, whose kernels round a 9-row and a 23-row call differently (the random-weight 0.6B int4
bundle's greedy codes diverged; benchmarks/ttfa). So ``TTS`` keeps prefixes only when asked
(``voice_prefix=True``).

Only the dynamic CPU Talker (``kztts.runners.talker.Talker``: its cache is host memory) supports it;
static HTP graphs, segmented and batched runners prefill whole prompts as before."""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from kztts.runners.talker import Talker
from kztts.tts.prompt import Prompt

DEFAULT_VOICES = 8  # prefixes kept (least recently used dropped); 0.6B: ~2.3 MB each in fp32


class VoicePrefixes:
    """Per-voice Talker prefixes for one ``Talker`` (``hits``/``misses`` count the lookups)."""

    def __init__(self, talker: Talker, capacity: int = DEFAULT_VOICES):
        self.talker = talker
        self.capacity = int(capacity)
        self._kept: OrderedDict[bytes, tuple[list[np.ndarray], list[np.ndarray]]] = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def supports(talker) -> bool:
        """Whether ``talker`` keeps its cache on the host (so a prefix can be copied in and out)."""
        return isinstance(talker, Talker)

    def prefill(self, prompt: Prompt) -> tuple[np.ndarray, np.ndarray]:
        """``talker.prefill(prompt.embeds)``, its voice prefix restored when kept: (logits, hidden) of the
        last position."""
        n = prompt.voice_positions
        if not 0 < n < prompt.embeds.shape[0]:
            return self.talker.prefill(prompt.embeds)
        key = hashlib.blake2b(np.ascontiguousarray(prompt.embeds[:n]).tobytes(), digest_size=16).digest()
        kept = self._kept.get(key)
        if kept is None:
            self.misses += 1
            self.talker.prefill(prompt.embeds[:n])
            self._kept[key] = self.talker.kv.snapshot()
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)
        else:
            self.hits += 1
            self._kept.move_to_end(key)
            self.talker.kv.restore(*kept)
        return self.talker.extend(prompt.embeds[n:])

    def clear(self) -> None:
        self._kept.clear()
