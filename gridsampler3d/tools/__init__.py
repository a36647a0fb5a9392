"""The project's tools, apart from the library: the command line (:mod:`.cli` and its :mod:`.commands`), the
benchmark suite's runner (:mod:`.bench`), the golden kit (:mod:`.golden_kit`) and the built-in inputs
(:mod:`.inputs`).

``import gridsampler3d`` imports none of them; ``gridsampler3d`` (the console script) and
``python -m gridsampler3d`` start here. They use the library through its public functions
and its engines' reports (plans, compiles), as a user's program would.
"""
