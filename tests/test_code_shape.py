"""The engines' functions stay readable: short, with few parameters (records carry the rest).

Every function of the CPU engine (Numba kernels included) and of the GPU engine (Triton
kernels and their ``@triton.jit`` helpers included).
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gridsampler3d"
ENGINES = (PACKAGE / "cpu", PACKAGE / "gpu")
MAX_LINES = 60  # lines of code: no docstring, comment or blank line
MAX_PARAMETERS = 12


def _functions():
    for path in sorted(path for engine in ENGINES for path in engine.glob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.parent.name}/{path.name}", node, lines


def _code_lines(node, lines) -> int:
    body = node.body
    docstring = (
        isinstance(body[0], ast.Expr)
        and isinstance(getattr(body[0], "value", None), ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    skipped = set(range(body[0].lineno, body[0].end_lineno + 1)) if docstring else set()
    return sum(
        1
        for number in range(body[0].lineno, node.end_lineno + 1)
        if number not in skipped and lines[number - 1].strip() and not lines[number - 1].strip().startswith("#")
    )


def _parameters(node) -> int:
    arguments = node.args
    names = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    count = len(names) + bool(arguments.vararg) + bool(arguments.kwarg)
    return count - (1 if names and names[0].arg in ("self", "cls") else 0)


@pytest.mark.parametrize(
    "limit, measure", [(MAX_LINES, _code_lines), (MAX_PARAMETERS, None)], ids=["lines", "parameters"]
)
def test_no_function_is_too_long_or_takes_too_many_parameters(limit, measure):
    offenders = [
        (name, node.name, measure(node, lines) if measure else _parameters(node)) for name, node, lines in _functions()
    ]
    offenders = [offender for offender in offenders if offender[2] > limit]
    assert not offenders, offenders
