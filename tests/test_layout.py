"""The layout of study/ and trainables/: no import cycle (imports inside functions count), no command importing another
command, modules a reader can hold (docs/architecture.md draws the packages and what each may import).

The import graph is read from the source (every ``import`` and ``from ... import``, at any depth), not from what an
interpreter loaded, so an import hidden in a function is an edge like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("study", "trainables")
# the commands: a command's modules import no other command's (what two commands share lives below them)
COMMANDS = ("study.launch", "study.final", "study.report", "study.sync", "study.relocate", "study.serve")
# the command line of each command: parsing, the human summary, the exit status
CLI_MODULES = ("study.launch.cli", "study.final.cli", "study.report.cli", "study.sync", "study.relocate", "study.serve.cli")
MAX_MODULE_LINES = 500
MAX_CLI_LINES = 450


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """{dotted module name: file} of every module under ``packages`` (a package is named by its folder)."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imported_names(path: Path, module: str, is_package: bool) -> set[str]:
    """Every dotted name ``path`` imports anywhere in it, relative imports resolved; ``from a import b`` gives a and a.b."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """{module: the project's modules it imports}. Importing one's own enclosing package is no edge: Python imports a
    package before any of its modules, so that edge is in every package and says nothing of the design."""
    files = module_files(root, packages)
    graph = {}
    for module, path in files.items():
        names = imported_names(path, module, path.name == "__init__.py")
        graph[module] = {n for n in names if n in files and n != module and not module.startswith(n + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def command_of(module: str) -> str | None:
    return next((c for c in COMMANDS if module == c or module.startswith(c + ".")), None)


def cross_command_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) where the imported module belongs to a command and the importer to another or to none."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if command_of(b) is not None and command_of(a) != command_of(b))


def test_no_import_cycle_among_the_projects_modules():
    assert cycles(import_graph(ROOT)) == []


def test_no_module_imports_a_command_but_its_own():
    assert cross_command_imports(import_graph(ROOT)) == []


def test_modules_a_reader_can_hold():
    files = module_files(ROOT, ("study",))
    lengths = {m: len(p.read_text().splitlines()) for m, p in files.items()}
    assert {m: n for m, n in lengths.items() if n > MAX_MODULE_LINES} == {}
    assert {m: lengths[m] for m in CLI_MODULES if lengths[m] > MAX_CLI_LINES} == {}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_graph_sees_a_cycle_hidden_in_a_function_and_a_relative_import(tmp_path):
    write(
        tmp_path,
        {
            "study/__init__.py": "",
            "study/a.py": "def f():\n    from study.b import g\n",
            "study/b.py": "from . import c\n",
            "study/c.py": "import study.a\n",
            "study/d.py": "from study.a import f\n",
            "trainables/__init__.py": "",
        },
    )
    graph = import_graph(tmp_path)
    assert graph["study.b"] == {"study.c"} and graph["study.d"] == {"study.a"}
    assert cycles(graph) == [["study.a", "study.b", "study.c"]]


def test_the_graph_sees_a_command_importing_another(tmp_path):
    write(
        tmp_path,
        {
            "study/__init__.py": "",
            "study/launch/__init__.py": "",
            "study/launch/cli.py": "from ..final import plan\n",
            "study/final/__init__.py": "",
            "study/final/plan.py": "from study.final import cli\n",
            "study/final/cli.py": "",
            "study/console.py": "def f():\n    import study.sync\n",
            "study/sync.py": "",
            "trainables/__init__.py": "",
        },
    )
    found = cross_command_imports(import_graph(tmp_path))
    assert found == [("study.console", "study.sync"), ("study.launch.cli", "study.final"), ("study.launch.cli", "study.final.plan")]


@pytest.mark.parametrize("module", CLI_MODULES)
def test_each_command_line_module_exists(module):
    assert module in module_files(ROOT, ("study",))
