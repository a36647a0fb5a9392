"""``python -m gridsampler3d``: the command line of :mod:`gridsampler3d.tools.cli`."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
