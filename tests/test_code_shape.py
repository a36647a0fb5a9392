"""The engines' functions stay readable: short, with few parameters (records carry the rest).

Every function of the CPU engine (Numba kernels included) and of the GPU engine (Triton
kernels and their ``@triton.jit`` helpers included).
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gridsampler3d"
ENGINES = (PACKAGE / "cpu", PACKAGE / "gpu")
# Statements, not lines: the formatter (ruff) lays a call that does not fit in 120 columns
# out one argument per line, so a function's line count measures its calls' lengths as much
# as its size. Each statement counts once, a compound one (if, for) and those in its body
# each count, a nested function's count toward it too; the docstring does not count. Before
# the formatter every function here was within 60 lines of code, and within 52 statements.
MAX_STATEMENTS = 55
MAX_PARAMETERS = 12


def _functions():
    for path in sorted(path for engine in ENGINES for path in engine.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.parent.name}/{path.name}", node


def _statements(node) -> int:
    first = node.body[0]
    docstring = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    return sum(
        1
        for sub in ast.walk(node)
        if isinstance(sub, ast.stmt) and sub is not node and not (docstring and sub is first)
    )


def _parameters(node) -> int:
    arguments = node.args
    names = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    count = len(names) + bool(arguments.vararg) + bool(arguments.kwarg)
    return count - (1 if names and names[0].arg in ("self", "cls") else 0)


@pytest.mark.parametrize(
    "limit, measure", [(MAX_STATEMENTS, _statements), (MAX_PARAMETERS, None)], ids=["statements", "parameters"]
)
def test_no_function_is_too_long_or_takes_too_many_parameters(limit, measure):
    offenders = [(name, node.name, (measure or _parameters)(node)) for name, node in _functions()]
    offenders = [offender for offender in offenders if offender[2] > limit]
    assert not offenders, offenders
