"""Run the Python examples of a markdown page the way a reader would, and check what they say they print.

The convention (written for authors in ``docs/development.md``):

- Every fenced block opened with ```` ```python ```` is an example. The blocks of one page run in order
  in one namespace (like a notebook's cells), in a temporary working directory.
- ``#>`` comment lines right after a statement are what that statement prints, line by line; they are
  compared with what it really printed. In them ``…`` stands for any text (the rest of a long line,
  a part that changes from run to run), and every number is compared as a number: an integer exactly, a
  decimal within one unit of its last written digit (``0.80`` matches 0.79 to 0.81), unless the block
  states a wider tolerance. Other comments explain and are not checked.
- An HTML comment on the line before the fence sets the block's options:
  ``<!-- example: skip: needs the hub -->`` (the block is not run and the reason is reported),
  ``<!-- example: rtol=0.5 -->`` (its decimals also match within 50 %: floating-point noise such as a
  validation's max error, which changes with the machine and the number of threads).
"""

from __future__ import annotations

import ast
import contextlib
import io
import math
import os
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```python\s*$")
OPTIONS = re.compile(r"^<!--\s*example:\s*(.*?)\s*-->\s*$")
_NUMBER = r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
NUMBER = re.compile(_NUMBER)


@dataclass
class Block:
    """One ```python block: where it starts (the 1-based line of its first code line) and its options."""

    path: Path
    line: int
    code: str
    skip: str | None = None
    rtol: float = 0.0

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


@dataclass
class Outcome:
    block: Block
    skipped: str | None = None
    checked: int = 0  # #> lines compared
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def blocks(path: Path) -> list[Block]:
    """The page's ```python blocks in order, with the options of the ``<!-- example: … -->`` before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            block = Block(path, start + 1, "\n".join(lines[start:j]) + "\n")
            prev = i - 1
            while prev >= 0 and not lines[prev].strip():
                prev -= 1
            if prev >= 0 and (m := OPTIONS.match(lines[prev].strip())):
                _options(block, m.group(1))
            out.append(block)
            i = j + 1
        else:
            i += 1
    return out


def _options(block: Block, text: str) -> None:
    if text.startswith("skip"):
        block.skip = text.partition(":")[2].strip() or "marked skip"
        return
    for part in text.split(","):
        key, _, value = part.strip().partition("=")
        if key == "rtol":
            block.rtol = float(value)
        else:
            raise ValueError(f"{block.where}: unknown example option {part!r} (skip: why, or rtol=…)")


def expected_outputs(code: str) -> list[tuple[ast.stmt, list[str]]]:
    """Each top-level statement with the ``#>`` lines that follow it (its printed output)."""
    tree = ast.parse(code)
    lines = code.splitlines()
    out = []
    for k, stmt in enumerate(tree.body):
        stop = tree.body[k + 1].lineno - 1 if k + 1 < len(tree.body) else len(lines)
        assert stmt.end_lineno is not None
        following = lines[stmt.end_lineno : stop]
        shown = [ln.strip()[2:].removeprefix(" ") for ln in following if ln.strip().startswith("#>")]
        out.append((stmt, shown))
    return out


def run_page(path: Path, workdir: Path) -> list[Outcome]:
    """Every block of the page, in order, in one namespace, from ``workdir``."""
    namespace: dict = {"__name__": "__example__"}
    outcomes = []
    page = blocks(path)
    previous = os.getcwd()
    os.chdir(workdir)
    try:
        for block in page:
            outcome = Outcome(block)
            outcomes.append(outcome)
            if block.skip:
                outcome.skipped = block.skip
                continue
            start = time.perf_counter()
            _run_block(block, namespace, outcome)
            outcome.seconds = time.perf_counter() - start
            if outcome.problems and outcome.problems[0].startswith("raised"):
                break  # what follows depends on it
    finally:
        os.chdir(previous)
    return outcomes


def _run_block(block: Block, namespace: dict, outcome: Outcome) -> None:
    try:
        statements = expected_outputs(block.code)
    except SyntaxError as err:
        outcome.problems.append(f"raised SyntaxError at {block.path.name}:{block.line + (err.lineno or 1) - 1}: {err}")
        return
    for stmt, shown in statements:
        line = block.line + stmt.lineno - 1
        code = compile(ast.Module([stmt], []), f"{block.path.name}:{line}", "exec")
        buffer = io.StringIO()
        try:
            with contextlib.redirect_stdout(buffer):
                exec(code, namespace)
        except Exception as err:  # noqa: BLE001 - reported with where it happened
            inner = traceback.extract_tb(err.__traceback__)[-1]
            outcome.problems.append(
                f"raised at {block.path.name}:{line}: {type(err).__name__}: {err}"
                + (f" (in {inner.filename}:{inner.lineno})" if inner.filename != code.co_filename else "")
            )
            return
        if shown:
            outcome.checked += len(shown)
            problem = compare(shown, buffer.getvalue(), block.rtol)
            if problem:
                outcome.problems.append(f"{block.path.name}:{line} printed something else: {problem}")


def compare(shown: list[str], printed: str, rtol: float = 0.0) -> str | None:
    """``None`` when the printed text is what the ``#>`` lines show, else what differs."""
    actual = printed.rstrip("\n").splitlines()
    if len(actual) != len(shown):
        return f"{len(actual)} lines, the page shows {len(shown)}:\n  printed: {actual!r}\n  shown:   {shown!r}"
    for want, got in zip(shown, actual):
        why = _compare_line(want, got, rtol)
        if why:
            return f"{why}\n  printed: {got}\n  shown:   {want}"
    return None


def _pattern(line: str) -> tuple[re.Pattern, list[str]]:
    """A regex of the shown line: ``…`` any text, each number a group; and the numbers as written."""
    parts, numbers = [], []
    pos = 0
    for m in NUMBER.finditer(line):
        parts.append(_literal(line[pos : m.start()]))
        parts.append(f"({_NUMBER}|nan|inf)")
        numbers.append(m.group())
        pos = m.end()
    parts.append(_literal(line[pos:]))
    return re.compile("".join(parts) + r"\s*$"), numbers


def _literal(text: str) -> str:
    return ".*?".join(re.escape(piece) for piece in text.split("…"))


def _compare_line(want: str, got: str, rtol: float) -> str | None:
    pattern, numbers = _pattern(want.rstrip())
    m = pattern.match(got.rstrip())
    if not m:
        return "the text differs"
    for written, value in zip(numbers, m.groups()):
        if not _close(written, value, rtol):
            return f"{value} where the page shows {written}"
    return None


def _close(written: str, value: str, rtol: float) -> bool:
    try:
        a = float(value.replace(",", ""))
    except ValueError:
        return False
    w = written.replace(",", "")
    e = float(w)
    mantissa, _, exponent = w.lower().partition("e")
    if "." not in mantissa:
        if not exponent:
            return a == e  # an integer: exactly
        unit = 10.0 ** int(exponent)
    else:
        unit = 10.0 ** (-len(mantissa.split(".")[1]) + (int(exponent) if exponent else 0))
    return math.isclose(a, e, abs_tol=unit * 1.0001) or abs(a - e) <= rtol * abs(e)
