"""Tests see cgwatch's internals only through cgwatch/testdoor.py (docs/design.md §2): no test
reads or writes a private attribute of a cgwatch object, plants one on any object, imports a
private name, or names one to getattr/setattr/monkeypatch, in its own code or in the code it
hands a child process.

"Private" is a name cgwatch itself defines with one leading underscore (a module or class
global, a function, a class, an attribute it assigns, a `__slots__` entry, a module file):
collected from cgwatch's source, so the check never flags another library's underscore names
(`psutil._psplatform`, DeepSpeed's `accel._name`, `os._exit`) unless cgwatch defines the same
name. It reads `self._x` in a test's own class as the test's own.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "cgwatch"
TESTS = REPO / "tests"

# Names with a leading underscore that are public API: namedtuple's (psutil's svmem) and
# frozen.Frozen's, which copies it.
PUBLIC = {"_fields", "_asdict", "_replace", "_make", "_field_defaults"}
# Files another change is rewriting; each must still hold a private access (else remove it
# from here: test_the_exemptions_are_still_needed).
EXEMPT = {"tests/test_testdoor.py": "the samples each form is checked on"}
OWN = {"self", "cls"}
SETTERS = {"getattr", "setattr", "delattr", "hasattr"}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC


def _defined(body: list[ast.stmt], names: set[str]) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                _defined(node.body, names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
                if (isinstance(target, ast.Name) and target.id == "__slots__"
                        and node.value is not None):
                    names.update(c.value for c in ast.walk(node.value)
                                 if isinstance(c, ast.Constant) and isinstance(c.value, str))
        elif isinstance(node, (ast.If, ast.Try)):
            _defined(node.body + node.orelse, names)


def cgwatch_privates() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        names.add(path.stem)
        tree = ast.parse(path.read_text())
        _defined(tree.body, names)
        names.update(n.attr for n in ast.walk(tree)
                     if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store))
    return {name for name in names if private(name)}


PRIVATE = cgwatch_privates()


def _embedded_code(tree: ast.AST) -> Iterator[str]:
    """The multi-line strings a test hands to a child process (`python -c CODE`); f-strings
    with each hole read as `0`. One-line strings (messages, module names) are not code."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "0" for v in node.values)
        else:
            continue
        if "\n" in text.strip():
            yield textwrap.dedent(text)


def _accesses(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
                node.attr in PRIVATE
                # planting a private attribute on another object is reaching in too
                or (isinstance(node.ctx, ast.Store) and private(node.attr))):
            if not (isinstance(node.value, ast.Name) and node.value.id in OWN):
                yield f"line {node.lineno}: .{node.attr}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cgwatch"):
            parts = (node.module or "").split(".") + [a.name for a in node.names]
            yield from (f"line {node.lineno}: import {p}" for p in parts if p in PRIVATE)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "cgwatch":
                    yield from (f"line {node.lineno}: import {p}" for p in parts if p in PRIVATE)
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[1]
            if name in SETTERS and isinstance(arg, ast.Constant) and arg.value in PRIVATE:
                yield f"line {node.lineno}: {name}(..., {arg.value!r})"


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = list(_accesses(tree))
    for code in _embedded_code(tree):
        try:
            found += [f"in a code string, {v}" for v in _accesses(ast.parse(code))]
        # A shell script or a fragment: read it as text. A string with a NUL byte is one
        # too: Python 3.9 and 3.10 raise ValueError for it, 3.11+ SyntaxError.
        except (SyntaxError, ValueError):
            found += [f"in a string, .{m}" for m in re.findall(r"(?<!self)\.(_[A-Za-z]\w*)", code)
                      if m in PRIVATE]
    return found


def test_the_private_names_are_read_from_cgwatch() -> None:
    # A few that exist today, so an empty or broken collection cannot pass silently.
    assert {"_fast", "_host_virtual_memory", "_libc", "_tracker", "_autoload"} <= PRIVATE
    assert not PRIVATE & PUBLIC


def test_no_test_reads_a_private_name_of_cgwatch() -> None:
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        where = str(path.relative_to(REPO))
        if where not in EXEMPT and violations(path):
            found[where] = violations(path)
    assert found == {}, "use cgwatch/testdoor.py (or a public seam) instead"


def test_the_check_catches_each_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(textwrap.dedent('''
        from cgwatch import psutil_view
        from cgwatch.integrations import _autoload
        from cgwatch.psutil_view import _FastPath
        psutil_view._fast.usable = False
        setattr(psutil_view, "_installed", None)
        CHILD = """
            from cgwatch import psutil_view
            print(psutil_view._host())
        """
        class Own:
            def _read(self):
                return self._read
        host._fields, accel._name, os._exit  # public or not cgwatch's
        monitor._planted_by_the_test = 1
    '''))
    assert sorted(violations(sample)) == sorted([
        "line 3: import _autoload", "line 4: import _FastPath", "line 5: ._fast",
        "line 6: setattr(..., '_installed')", "in a code string, line 3: ._host",
        "line 15: ._planted_by_the_test"])


def test_the_exemptions_are_still_needed() -> None:
    for where in EXEMPT:
        assert violations(REPO / where), f"{where} reads no private name now: drop its exemption"
