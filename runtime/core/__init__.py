"""The ground floor: what every other layer leans on, and nothing of kztts above it.

Errors users see (``errors``), every ``KZTTS_*`` variable (``env``), outputs written all-or-none
(``atomic``), progress lines (``progress``), the cache folder and build-once directories (``cache``,
``build_cache``), one call at a time (``call_lock``), work in a fresh process (``worker_process``),
optional extras (``extras``), numpy's BLAS at one thread (``blas``), audio files (``audio``) and the accuracy/timing summaries every
comparison shares (``metrics``).

May import: only ``kztts.core``.
"""
