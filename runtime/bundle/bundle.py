"""A bundle on disk: manifest, graphs, embedding tables and tokenizer, checked at open."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from kztts.bundle.embeddings import load_table
from kztts.bundle.manifest import Manifest, read_manifest
from kztts.bundle.sessions import SessionConfig, open_session
from kztts.core.errors import BundleError

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"


@dataclass
class Bundle:
    """An opened bundle. Graph sessions are created by ``session(name)`` and kept."""

    path: Path
    manifest: Manifest
    session_config: SessionConfig = field(default_factory=SessionConfig)
    _sessions: dict[str, ort.InferenceSession] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: str | Path, session_config: SessionConfig | None = None,
             load_graphs: bool = True) -> "Bundle":
        """Read and check a bundle. With ``load_graphs`` every CPU graph is opened now,
        so a corrupt or mismatched ONNX file fails here, naming the file."""
        path = Path(path)
        manifest = read_manifest(path)
        bundle = cls(path, manifest, session_config or SessionConfig())
        bundle._check_files()
        if load_graphs:
            for name, spec in manifest.graphs.items():
                if spec.variant == "dynamic":
                    bundle.session(name)
        return bundle

    def _check_files(self) -> None:
        if not (self.path / TOKENIZER_FILE).is_file():
            raise BundleError(f"{self.path / TOKENIZER_FILE}: tokenizer missing; re-export the bundle")
        for name, spec in self.manifest.graphs.items():
            f = self.path / spec.file
            if not f.is_file():
                raise BundleError(f"{f}: graph file for {name!r} is missing; re-export the bundle")
            size = spec.extra.get("bytes")
            if size is not None and f.stat().st_size != size:
                raise BundleError(f"{f}: {f.stat().st_size} bytes, the manifest says {size}: the file "
                                  "is truncated or from another export; re-export the bundle")
        shared = self.manifest.data.get("weights")  # the CPU graphs' one weights file (format 2)
        if shared is not None:
            f = self.path / shared["file"]
            if not f.is_file():
                raise BundleError(f"{f}: the graphs' shared weights file is missing; re-export the bundle")
            if f.stat().st_size != shared["bytes"]:
                raise BundleError(f"{f}: {f.stat().st_size} bytes, the manifest says {shared['bytes']}: the shared "
                                  "weights file is truncated or from another export; re-export the bundle")
        for name, spec in self.manifest.embeddings.items():
            self.table(name)

    def table(self, name: str) -> np.ndarray:
        """An embedding table, memory-mapped (not read into RAM), checked against the manifest."""
        try:
            spec = self.manifest.embeddings[name]
        except KeyError:
            raise BundleError(f"{self.manifest.path}: no embedding table {name!r}") from None
        return load_table(self.path, name, spec)

    def session(self, name: str) -> ort.InferenceSession:
        if name not in self._sessions:
            try:
                spec = self.manifest.graphs[name]
            except KeyError:
                raise BundleError(f"{self.manifest.path}: the bundle has no graph {name!r} "
                                  f"(it has {sorted(self.manifest.graphs)})") from None
            self._sessions[name] = open_session(self.path, spec, self.session_config)
        return self._sessions[name]
