"""``python -m gridsampler3d``: the command line of :mod:`gridsampler3d.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
