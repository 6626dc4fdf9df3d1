"""The ``kztts`` command line: ``main`` builds the parser and runs a command inside the one error
boundary (``boundary``); ``__main__`` is ``python -m kztts.cli``; every other module is one command,
named after it: ``synth`` (and ``synth_many``, its ``--file`` form), ``generate``, ``chat``, ``export``,
``make_tiny``, ``fetch_lm``, ``validate``, ``calibrate``, ``inspect``, ``devices`` and ``bench``
(``kztts serve`` lives in ``kztts.server.command``).

May import: anything of kztts (``kztts.export`` only inside a command, as torch is an optional extra).
Nothing imports ``kztts.cli``.
"""
