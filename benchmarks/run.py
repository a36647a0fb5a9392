"""Entry point of the benchmark suite: ``python benchmarks/run.py [options]``.

The same as ``gridsampler3d bench``; the registry lives in ``gridsampler3d/bench/suite.py``
so that the installed command line can run it too.
"""
import sys

from gridsampler3d.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
