"""Text -> token ids, exactly as qwen-tts builds them (``Qwen3TTSModel._build_assistant_text``,
``_build_ref_text`` and ``_tokenize_texts``), with the bundle's ``tokenizer.json``.

The whole template is tokenized at once and the prompt builder slices the ids by
position (``[:3]`` role, ``[3:-5]`` text, ``[3:-2]`` for the reference text), as the
reference does; tokenizing the text alone could merge differently at the edges.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from kztts.core.errors import BundleError, KzttsError

TOKENIZER_FILE = "tokenizer.json"


def assistant_text(text: str) -> str:
    """qwen-tts ``_build_assistant_text``."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_template(instruct: str) -> str:
    """qwen-tts ``_build_instruct_text``: the instruction as a user turn in front of the prompt."""
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def ref_text_template(text: str) -> str:
    """qwen-tts ``_build_ref_text``."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


class TextTokenizer:
    """The bundle's text tokenizer (``tokenizers`` library, no transformers)."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.is_file():
            raise BundleError(f"{path}: tokenizer missing; re-export the bundle")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise BundleError(f"{path}: unreadable tokenizer ({exc}); re-export the bundle") from exc
        self.path = path

    def encode(self, s: str) -> np.ndarray:
        """Token ids of ``s`` as the HF tokenizer gives them (special tokens parsed), int64."""
        return np.asarray(self._tok.encode(s).ids, dtype=np.int64)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @staticmethod
    def _check(text, what: str) -> str:
        if not isinstance(text, str):
            raise KzttsError(f"{what} must be a string, got {type(text).__name__}")
        if not text.strip():
            raise KzttsError(f"{what} is empty; give some text to speak" if what == "text" else
                             f"{what} is empty; give the transcript of the reference audio")
        return text

    def assistant_ids(self, text: str) -> np.ndarray:
        """Ids of the assistant template around ``text`` (qwen-tts ``input_ids``), int64 [n]."""
        ids = self.encode(assistant_text(self._check(text, "text")))
        if len(ids) < 9:
            raise KzttsError(f"text {text!r} gives no tokens to speak")
        return ids

    def instruct_ids(self, instruct: str) -> np.ndarray:
        """Ids of the instruction template (qwen-tts ``instruct_ids``), int64 [n]."""
        if not isinstance(instruct, str):
            raise KzttsError(f"the instruction must be a string, got {type(instruct).__name__}")
        return self.encode(instruct_template(instruct))

    def ref_ids(self, ref_text: str) -> np.ndarray:
        """Ids of the reference-transcript template (qwen-tts ``ref_ids``), int64 [n]."""
        ids = self.encode(ref_text_template(self._check(ref_text, "reference text")))
        if len(ids) < 6:
            raise KzttsError(f"reference text {ref_text!r} gives no tokens")
        return ids

    @staticmethod
    def text_body(input_ids: np.ndarray) -> np.ndarray:
        """The text tokens of ``assistant_ids`` (``[3:-5]``, as qwen-tts slices them)."""
        return np.asarray(input_ids)[3:-5]

    @staticmethod
    def ref_body(ref_ids: np.ndarray) -> np.ndarray:
        """The text tokens of ``ref_ids`` (``[3:-2]``, as qwen-tts slices them)."""
        return np.asarray(ref_ids)[3:-2]
