"""Functions stay short (issue 42): at most 5 functions in src/silofl over 100 lines, where a function's
length is its ``def`` line through its last line (decorators not counted), from the AST."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "silofl"
LONG = 100  # lines
MOST = 5  # functions over LONG


def long_functions(root: Path = SRC) -> list[tuple[int, str]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LONG:
                    found.append((n, f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def test_at_most_five_functions_over_a_hundred_lines():
    found = long_functions()
    listing = "\n".join(f"{n} {where}" for n, where in found)
    assert len(found) <= MOST, (
        f"{len(found)} functions over {LONG} lines (at most {MOST}), split one:\n{listing}"
    )


def test_the_count_finds_a_method_one_line_too_long(tmp_path):
    def body(k: int) -> str:  # a function of k lines, its def line included
        return "\n".join(f"        x{i} = {i}" for i in range(k - 1))

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    short = f"    @staticmethod\n    def short():\n{body(LONG)}\n"  # decorators are not counted
    (pkg / "sub" / "m.py").write_text(f"class C:\n{short}\n    async def long():\n{body(LONG + 1)}\n")
    assert long_functions(pkg) == [(LONG + 1, f"pkg/sub/m.py:{LONG + 4} long")]
