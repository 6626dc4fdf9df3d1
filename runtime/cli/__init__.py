"""The ``kztts`` command line: ``main`` builds the parser and runs a command inside the one error
boundary (``boundary``); every other module is one command, named after it.

May import: anything of kztts (``kztts.export`` only inside a command, as torch is an optional extra).
Nothing imports ``kztts.cli``.
"""
