"""How a token is chosen: the sampling chains as data (``sampling_chain``), the host sampler that
follows them with a portable random stream (``sampling``), and the settings a synthesis or a
generation runs with (``settings``: reference defaults, presets, flag and environment overrides).

May import: ``kztts.core``, ``kztts.bundle``.
"""
