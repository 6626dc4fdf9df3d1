"""``python -m kztts.cli``: the ``kztts`` command."""
import sys

from kztts.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
