"""The layer map of docs/design.md section 2, as a test: every module of cgwatch/ has a layer,
no import goes to a higher layer except the ones listed here (and in design.md), every
internal module's docstring starts with "Internal.", the design table says what LAYER says,
the package's import cycles are the known ones, the pure modules import only the standard
library's pure parts (`PURE_STDLIB`), no adapter imports another (`ADAPTERS`), and bench/
imports nothing from tests/.

How the import graph is drawn (`import_graph`): an AST walk of every .py file under cgwatch/,
every `import` and `from ... import` at any depth (module level, inside functions, inside
try/if), relative ones resolved against the importing module's package; `from . import x`
counts as an import of the module `x` when `x` is one, else of the package. The lazy names of
`cgwatch/__init__.py` (`_LAZY`, loaded with importlib on first use) are edges too. Not edges:
- imports inside `if TYPE_CHECKING:` blocks: they load nothing at run time, and a type-only
  import may point anywhere (a pure module may name a higher layer's type in its annotations
  that way, as a pure guard would take the `MemorySource` protocol from psutil_view);
- the parent packages Python runs before a submodule (`cgwatch.cli.show` runs
  `cgwatch/cli/__init__.py` first): every module would then import `cgwatch`;
- importlib.import_module of third-party modules (DeepSpeed's accelerator).
A cycle is a strongly connected component of more than one module of that graph.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(PROJECT, "cgwatch")

# The layers, bottom up. A module may import from its own layer and the ones below it.
LAYERS = ("base", "pure rules", "I/O edges", "machinery", "core", "public API", "package",
          "commands", "tests' door")

# module -> layer. A new module gets a line here (test_every_module_has_a_layer says so), and
# a row of the table in docs/design.md section 2 (test_design_table_matches).
LAYER = {
    # Serve every floor: value classes without dataclasses, the lazy logger.
    "cgwatch.frozen": "base",
    "cgwatch.logs": "base",
    # Parse text, decide on numbers; no I/O.
    "cgwatch.values": "pure rules",
    "cgwatch.units": "pure rules",
    "cgwatch.names": "pure rules",
    "cgwatch.discovery": "pure rules",
    "cgwatch.counters": "pure rules",
    "cgwatch.alerts": "pure rules",
    "cgwatch.event": "pure rules",
    "cgwatch.headroom": "pure rules",
    "cgwatch.envswitch": "pure rules",
    "cgwatch.slurm": "pure rules",
    "cgwatch.decision": "pure rules",
    "cgwatch.forecast": "pure rules",
    "cgwatch.policy": "pure rules",
    "cgwatch.sampling": "pure rules",
    "cgwatch.trends": "pure rules",
    "cgwatch.timeline": "pure rules",
    "cgwatch.wouldstop": "pure rules",
    "cgwatch.guardrecord": "pure rules",
    "cgwatch.guardreplay": "pure rules",
    "cgwatch.savetimes": "pure rules",
    # Read kernel files, own descriptors.
    "cgwatch.files": "I/O edges",
    "cgwatch.kept": "I/O edges",
    "cgwatch.tree": "I/O edges",
    "cgwatch.hostmem": "I/O edges",
    "cgwatch.inotify": "I/O edges",
    "cgwatch.notify": "I/O edges",
    "cgwatch.quota": "I/O edges",
    "cgwatch.ownfile": "I/O edges",
    "cgwatch.proclimits": "I/O edges",
    "cgwatch.slurmctl": "I/O edges",
    "cgwatch.shm": "I/O edges",
    "cgwatch.ranks": "I/O edges",
    "cgwatch.saves": "I/O edges",
    "cgwatch.recordfile": "I/O edges",
    # The thread, the watch set, the immutable snapshot, the seam types.
    "cgwatch.loop": "machinery",
    "cgwatch.seam": "machinery",
    "cgwatch.watchhub": "machinery",
    "cgwatch.watchlease": "machinery",
    "cgwatch.ticker": "machinery",
    "cgwatch.snapshot": "machinery",
    # Keep one monitor's snapshot true (and build it); count and log one layout's events.
    "cgwatch.tracker": "core",
    "cgwatch.resolver": "core",
    "cgwatch.scanner": "core",
    "cgwatch.eventlog": "core",
    # What users hold.
    "cgwatch.monitor": "public API",
    "cgwatch.default": "public API",
    "cgwatch.events": "public API",
    "cgwatch.psutil_view": "public API",
    "cgwatch.prometheus": "public API",
    "cgwatch.guard": "public API",
    "cgwatch.integrations": "public API",
    "cgwatch.integrations._autoload": "public API",
    "cgwatch.integrations.deepspeed": "public API",
    "cgwatch.integrations.deepspeed_guard": "public API",
    "cgwatch.integrations._guarded": "public API",
    "cgwatch.integrations.transformers": "public API",
    "cgwatch.integrations.lightning": "public API",
    "cgwatch.integrations.ray": "public API",
    "cgwatch.integrations.switches": "public API",
    # `cgwatch` itself: the module functions, the default monitor, the lazy names.
    "cgwatch": "package",
    # The commands; the library never imports them.
    "cgwatch.__main__": "commands",
    "cgwatch.integrations.__main__": "commands",
    "cgwatch.cli": "commands",
    "cgwatch.cli.__main__": "commands",
    "cgwatch.cli.cause": "commands",
    "cgwatch.cli.child": "commands",
    "cgwatch.cli.coalesce": "commands",
    "cgwatch.cli.explain": "commands",
    "cgwatch.cli.format": "commands",
    "cgwatch.cli.plot": "commands",
    "cgwatch.cli.run": "commands",
    "cgwatch.cli.runguard": "commands",
    "cgwatch.cli.observed": "commands",
    "cgwatch.cli.replay": "commands",
    "cgwatch.cli.ckptwatch": "commands",
    "cgwatch.cli.savedelay": "commands",
    "cgwatch.cli.restarts": "commands",
    "cgwatch.cli.runlog": "commands",
    "cgwatch.cli.runverbose": "commands",
    "cgwatch.cli.serve": "commands",
    "cgwatch.cli.show": "commands",
    "cgwatch.cli.watch": "commands",
    # What tests need of internals; only tests import it.
    "cgwatch.testdoor": "tests' door",
}

# Imports to a higher layer that are meant (design.md section 2 lists them too). None today:
# the default monitor, which the events layer, the psutil view, the collector, the guard and
# DeepSpeed's accelerator ask for when given none, lives in cgwatch/default.py, below the
# package (it was imported from cgwatch/__init__ by each of them: four arrows upward).
UPWARD: dict[tuple[str, str], str] = {}

# Import cycles of the runtime graph that exist today, each with why.
KNOWN_CYCLES: dict[frozenset[str], str] = {}

# Public per design.md section 2: what `cgwatch/__init__.py` exports, the modules users import
# by name, and the command's entry points. Every other module is internal.
PUBLIC = {
    "cgwatch", "cgwatch.__main__", "cgwatch.events", "cgwatch.alerts", "cgwatch.event",
    "cgwatch.psutil_view", "cgwatch.prometheus", "cgwatch.guard", "cgwatch.integrations",
    "cgwatch.integrations.__main__", "cgwatch.integrations.deepspeed",
    "cgwatch.integrations.deepspeed_guard", "cgwatch.integrations.transformers",
    "cgwatch.integrations.lightning", "cgwatch.integrations.ray", "cgwatch.saves",
    "cgwatch.cli", "cgwatch.cli.__main__",
}


# What a "pure rules" module may import from outside cgwatch: modules that only compute (types,
# containers, text patterns, numbers), never touch a file, a descriptor, a process, a thread,
# the clock or the interpreter's state. `IMPURE` names what this rules out, so that a
# careless addition to PURE_STDLIB shows.
PURE_STDLIB = frozenset({
    "__future__", "typing", "collections", "collections.abc", "dataclasses", "re",
    "fractions", "decimal", "numbers", "math", "enum", "functools", "itertools", "operator",
    "string", "bisect", "heapq", "abc",
    "json",  # text to values and back, as re: guardrecord.py's lines
})
IMPURE = frozenset({
    "os", "os.path", "io", "sys", "socket", "subprocess", "threading", "time", "signal",
    "select", "selectors", "ctypes", "fcntl", "mmap", "errno", "pathlib", "shutil", "tempfile",
    "logging", "multiprocessing", "asyncio", "random", "importlib", "psutil",
})

# The framework adapters (each makes one framework cgroup-aware or guarded), and the
# integrations' shared parts that adapters may import: an adapter never imports another
# (docs/design.md section 13). A new module of cgwatch/integrations goes in one of the two.
ADAPTERS = frozenset({
    "cgwatch.integrations.deepspeed", "cgwatch.integrations.deepspeed_guard",
    "cgwatch.integrations.transformers", "cgwatch.integrations.lightning",
    "cgwatch.integrations.ray",
})
INTEGRATIONS_SHARED = frozenset({
    "cgwatch.integrations", "cgwatch.integrations.__main__", "cgwatch.integrations._autoload",
    "cgwatch.integrations._guarded", "cgwatch.integrations.switches",
})


class Edge(NamedTuple):
    source: str
    target: str
    line: int
    lazy: bool  # inside a function (or through _LAZY)


def module_files(package_dir: str = PACKAGE) -> dict[str, str]:
    """module name -> file, for every .py file under `package_dir`."""
    top = os.path.dirname(package_dir)
    found = {}
    for directory, _, files in os.walk(package_dir):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                module = os.path.relpath(path, top)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, lazy: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every import node under `node` outside TYPE_CHECKING blocks, with whether it runs
    inside a function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:  # the `else:` of a TYPE_CHECKING test runs
                yield from _walk(other, lazy)
            continue
        inside = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, inside
        yield from _walk(child, inside)


def _lazy_names(tree: ast.Module) -> dict[str, str]:
    """The `_LAZY` dict literal of cgwatch/__init__.py (name -> module), {} if none."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, dict)
            return value
    return {}


def import_graph(package_dir: str = PACKAGE) -> list[Edge]:
    """Every runtime import from a module of the package to another (see the docstring)."""
    files = module_files(package_dir)
    root = os.path.basename(package_dir)
    edges = []
    for module, path in sorted(files.items()):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node, lazy in _walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                assert isinstance(node, ast.ImportFrom)
                base = node.module or ""
                if node.level:
                    parent = package
                    for _ in range(node.level - 1):
                        parent = parent.rpartition(".")[0]
                    base = parent + ("." + node.module if node.module else "")
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                           for alias in node.names]
            for target in targets:
                if target.split(".")[0] == root and target != module:
                    edges.append(Edge(module, target, node.lineno, lazy))
        if module == root:
            for lazy_module in _lazy_names(tree).values():
                edges.append(Edge(module, f"{root}.{lazy_module}", 0, True))
    return edges


def outside_imports(path: str) -> list[tuple[str, int]]:
    """The modules a file imports from outside its package at run time (absolute imports not
    of cgwatch, outside TYPE_CHECKING blocks), with the line of each."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node, _ in _walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            assert isinstance(node, ast.ImportFrom)
            names = [] if node.level else [node.module or ""]
        found += [(name, node.lineno) for name in names if name.split(".")[0] != "cgwatch"]
    return found


def import_cycles(edges: list[Edge]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module."""
    succ: dict[str, set[str]] = {}
    for e in edges:
        succ.setdefault(e.source, set()).add(e.target)
        succ.setdefault(e.target, set())

    def reach(start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in succ[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reachable = {m: reach(m) for m in succ}
    components = {frozenset(m2 for m2 in reachable[m] if m in reachable[m2]) for m in succ}
    return sorted((c for c in components if len(c) > 1), key=sorted)


def upward_imports(edges: list[Edge]) -> list[Edge]:
    """The edges to a higher layer that UPWARD does not list."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return [e for e in edges if rank[LAYER[e.target]] > rank[LAYER[e.source]]
            and (e.source, e.target) not in UPWARD]


EDGES = import_graph()


def test_every_module_has_a_layer() -> None:
    files = set(module_files())
    assert not files - set(LAYER), "give these modules a layer in LAYER (and design.md §2)"
    assert not set(LAYER) - files, "these modules are gone: drop them from LAYER"
    assert set(LAYER.values()) <= set(LAYERS)


def test_the_walk_sees_every_kind_of_import() -> None:
    # One of each form, as the package writes them today: a module-level relative import, a
    # function-local `from .x import y` and `from . import x`, an absolute `from cgwatch
    # import x` in a function, a `from ..x import y` of a subpackage, and a _LAZY name.
    got = {(e.source, e.target, e.lazy) for e in EDGES}
    assert ("cgwatch.monitor", "cgwatch.tracker", False) in got
    assert ("cgwatch.events", "cgwatch.default", True) in got
    assert ("cgwatch.psutil_view", "cgwatch.default", True) in got
    assert ("cgwatch.integrations._autoload", "cgwatch.psutil_view", True) in got
    assert ("cgwatch.cli.show", "cgwatch.monitor", False) in got
    assert ("cgwatch", "cgwatch.events", True) in got
    # ... and skips type-only imports (monitor.py takes HeadroomSource under TYPE_CHECKING
    # only; prometheus.py takes tree.Level that way).
    assert ("cgwatch.prometheus", "cgwatch.tree") not in {(e.source, e.target) for e in EDGES}


def test_no_import_goes_upward() -> None:
    bad = upward_imports(EDGES)
    assert not bad, "\n".join(
        f"{e.source} (line {e.line}, {LAYER[e.source]}) imports {e.target} "
        f"({LAYER[e.target]}): a lower layer must not import a higher one; move the code, "
        "or list the import in UPWARD and docs/design.md §2 with why" for e in bad)


def test_every_listed_upward_import_still_exists() -> None:
    present = {(e.source, e.target) for e in EDGES}
    gone = [pair for pair in UPWARD if pair not in present]
    assert not gone, f"no longer imported: drop them from UPWARD and design.md §2: {gone}"


def test_import_cycles_are_the_known_ones() -> None:
    cycles = set(import_cycles(EDGES))
    new = [sorted(c) for c in cycles - set(KNOWN_CYCLES)]
    assert not new, f"new import cycles: {new}"
    gone = [sorted(c) for c in set(KNOWN_CYCLES) - cycles]
    assert not gone, f"these cycles are gone: drop them from KNOWN_CYCLES: {gone}"


def test_pure_modules_import_only_the_pure_standard_library() -> None:
    assert not PURE_STDLIB & IMPURE
    pure = sorted(m for m, layer in LAYER.items() if layer == "pure rules")
    files = module_files()
    bad = [f"{module} (line {line}) imports {name}" for module in pure
           for name, line in outside_imports(files[module]) if name not in PURE_STDLIB]
    assert not bad, "a pure module reads nothing and keeps no state: move the I/O to an " \
        "I/O edge and hand the pure code its result (or extend PURE_STDLIB with a module that " \
        "only computes):\n" + "\n".join(bad)


def test_the_pure_import_rule_sees_an_impure_import(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text("from __future__ import annotations\nimport re\nfrom typing import Any\n"
                    "from . import values\nif TYPE_CHECKING:\n    import os\n"
                    "def f():\n    import time\n    from os.path import join\n")
    assert [(n, line) for n, line in outside_imports(str(path)) if n not in PURE_STDLIB] == [
        ("time", 8), ("os.path", 9)]


def test_no_adapter_imports_another() -> None:
    integrations = {m for m in module_files() if m.startswith("cgwatch.integrations")}
    assert integrations == ADAPTERS | INTEGRATIONS_SHARED and not ADAPTERS & INTEGRATIONS_SHARED, \
        "put each module of cgwatch/integrations in ADAPTERS or INTEGRATIONS_SHARED"
    bad = [e for e in EDGES if e.source in ADAPTERS and e.target in ADAPTERS]
    assert not bad, "\n".join(
        f"{e.source} (line {e.line}) imports the adapter {e.target}: adapters share code "
        "through cgwatch/integrations/_guarded.py or the public API (design.md §13)"
        for e in bad)


def test_the_bench_imports_nothing_from_the_tests() -> None:
    # The tests may use the bench's parts (bench/cgroups.py's tree, bench.nodescale's fleet);
    # the bench runs from a checkout or an sdist on its own, so never the other way.
    bench = os.path.join(PROJECT, "bench")
    bad = [f"bench/{name} (line {line}) imports {module}"
           for name in sorted(os.listdir(bench)) if name.endswith(".py")
           for module, line in outside_imports(os.path.join(bench, name))
           if module.split(".")[0] == "tests"]
    assert not bad, "move what the bench needs into bench/ (or cgwatch/):\n" + "\n".join(bad)


def _docstring(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read()), clean=False) or ""


@pytest.mark.parametrize("module", sorted(LAYER))
def test_internal_modules_say_so(module: str) -> None:
    doc = _docstring(module_files()[module])
    assert doc, f"{module} has no docstring"
    if module in PUBLIC:
        assert not doc.startswith("Internal."), f"{module} is public (design.md §2)"
    else:
        assert doc.startswith("Internal."), (
            f"{module} is internal (not public per design.md §2): its docstring must start "
            "with 'Internal.'")


def _design_table() -> dict[str, str]:
    """module -> layer, from the layer table of docs/design.md section 2. A cell's `x.py` is
    cgwatch/x.py; `dir/` is every module of cgwatch/dir/ the table does not name elsewhere;
    `dir/x.py` is that module."""
    with open(os.path.join(PROJECT, "docs", "design.md"), encoding="utf-8") as f:
        text = f.read()
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+) \|", text, re.M)
    files = module_files()
    named: dict[str, str] = {}
    packages: dict[str, str] = {}
    for layer, cell in rows:
        if layer not in LAYERS:
            continue
        for token in re.findall(r"`([\w/]+(?:\.py)?)`", cell):
            if token.endswith("/"):
                packages["cgwatch." + token.rstrip("/").replace("/", ".")] = layer
            elif token.endswith(".py"):
                name = "cgwatch." + token[:-3].replace("/", ".")
                named[name.removesuffix(".__init__")] = layer
    for module in files:
        if module not in named:
            owner = max((p for p in packages if module == p or module.startswith(p + ".")),
                        key=len, default=None)
            if owner is not None:
                named[module] = packages[owner]
    return named


def test_design_table_matches() -> None:
    table = _design_table()
    assert table == LAYER, "docs/design.md §2's layer table and LAYER disagree: " + repr(
        {m: (table.get(m), LAYER.get(m)) for m in set(table) | set(LAYER)
         if table.get(m) != LAYER.get(m)})


if __name__ == "__main__":  # python -m tests.test_layers [PACKAGE_DIR]: the graph's figures
    import sys

    where = sys.argv[1] if len(sys.argv) > 1 else PACKAGE
    graph = import_graph(where)
    print(f"{len(module_files(where))} modules, {len({(e.source, e.target) for e in graph})} "
          f"import edges ({len({(e.source, e.target) for e in graph if e.lazy})} lazy)")
    for cycle in import_cycles(graph):
        print("cycle:", " ".join(sorted(cycle)))
    print("cycles without the lazy imports:", len(import_cycles([e for e in graph if not e.lazy])))
    for e in sorted({(e.source, e.target) for e in graph
                     if LAYERS.index(LAYER.get(e[1], "commands"))
                     > LAYERS.index(LAYER.get(e[0], "commands"))}):
        print("upward:", *e)
