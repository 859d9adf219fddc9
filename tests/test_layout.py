"""The layout docs/architecture.md draws holds in the code: its import graph, read from the
source, has one known cycle, and the HTTP API's layers import only downward.

Every module under src/tidegate is parsed (``ast``, nothing is imported) and each of its
imports of a tidegate module counts, wherever it stands:

- at the top of the module;
- inside a function: it runs when the function is called, a dependency all the same (an
  import moved into a function to dodge a cycle keeps the cycle);
- under ``if TYPE_CHECKING:``: the two modules can no longer be read or type-checked
  apart, and a cycle of types is how a cycle of code begins.

Not counted: the packages' ``__init__`` that Python runs before a submodule (importing
``tidegate.api.kernel`` runs ``tidegate/__init__.py``, the curated front door, which
imports ``tidegate.app``: counted, it would put every module in one cycle with the
app), and a module named in a string (``tidegate serve`` hands uvicorn
``"tidegate.api.server:create_server"``).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

import tidegate

SOURCE = Path(tidegate.__file__).parent

FRONT_DOOR_AND_WORKER = frozenset(
    {
        "tidegate.app",
        "tidegate.worker.completer",
        "tidegate.worker.counters",
        "tidegate.worker.execute",
        "tidegate.worker.link",
        "tidegate.worker.maintenance",
        "tidegate.worker.runtime",
        "tidegate.worker.scheduler",
        "tidegate.worker.workloop",
    }
)
"""The one cycle allowed: the library's front door and the worker runtime import each
other. ``Tidegate.run_worker`` starts a ``Worker`` (worker.runtime, imported inside the
method), and the worker reads the app's tasks (worker.execute imports ``Task``, the
link and the scheduler type-check against ``Tidegate``). A module that joins it, or any
other cycle, fails ``test_the_only_import_cycle_is_the_front_door_and_the_worker``."""

API = "tidegate.api"
DASHBOARD = "tidegate.ui"
KERNEL = "tidegate.api.kernel"
"""What every route needs: the API process's state (``Api``), the problem answers."""
ASSEMBLER = "tidegate.api.server"
"""``create_server``: the routers, the Guard and the dashboard put together."""
MAY_IMPORT_THE_ASSEMBLER = frozenset({ASSEMBLER, "tidegate.serve", "tidegate.cli"})
KNOWN_ROUTERS = frozenset(
    {
        "tidegate.api.admin",
        "tidegate.api.health",
        "tidegate.api.hooks",
        "tidegate.api.metrics",
        "tidegate.api.runs",
        "tidegate.api.workers",
        "tidegate.ui.pages",
        "tidegate.ui.runs",
        "tidegate.ui.triggers",
    }
)
"""Routers this test knows by name, to make sure it finds them: it finds every other
module that declares an ``APIRouter`` by itself."""


@functools.cache
def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _module_of(name: str) -> str | None:
    """The tidegate module ``name`` is, or is in (``tidegate.api.kernel.Api``: the kernel)."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, tree: ast.Module) -> Iterable[str]:
    """What every ``import`` of ``tree`` names, at any depth: ``from tidegate import
    forward`` names the module ``tidegate.forward``, ``from tidegate.app import Tidegate``
    the module ``tidegate.app``."""
    package = module if modules()[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:  # a submodule, else a name of ``base``
                name = f"{base}.{alias.name}"
                yield name if name in modules() else base


@functools.cache
def graph() -> dict[str, frozenset[str]]:
    """Each module and the tidegate modules it imports (itself left out)."""
    edges = {}
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {_module_of(name) for name in _imported(module, tree)}
        edges[module] = frozenset(t for t in targets if t is not None and t != module)
    return edges


def strongly_connected(edges: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The components of more than one module (Tarjan): each is a cycle, or cycles that
    share modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


@functools.cache
def routers() -> frozenset[str]:
    """The modules that declare an ``APIRouter`` at their top level: the API's routes and
    the dashboard's pages."""
    found = set()
    for module, path in modules().items():
        for node in ast.parse(path.read_text(), str(path)).body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if isinstance(value, ast.Call):
                called = value.func
                name = (
                    called.attr
                    if isinstance(called, ast.Attribute)
                    else (called.id if isinstance(called, ast.Name) else "")
                )
                if name == "APIRouter":
                    found.add(module)
    return frozenset(found)


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _offences(modules_: Iterable[str], forbidden: Iterable[str]) -> list[str]:
    """``module -> target`` for each import of a forbidden module, sorted."""
    banned = set(forbidden)
    return sorted(
        f"{module} -> {target}"
        for module in modules_
        for target in graph()[module]
        if target in banned
    )


def test_the_graph_is_read_from_every_module_and_finds_the_routers() -> None:
    edges = graph()
    assert KERNEL in edges[ASSEMBLER] and "tidegate.api.hooks" in edges[ASSEMBLER]
    assert "tidegate.worker.runtime" in edges["tidegate.app"]  # inside run_worker
    assert "tidegate.api.kernel" in edges["tidegate.api.events"]  # under TYPE_CHECKING
    assert routers() >= KNOWN_ROUTERS, sorted(KNOWN_ROUTERS - routers())


def test_the_only_import_cycle_is_the_front_door_and_the_worker() -> None:
    cycles = strongly_connected(graph())
    unknown = [", ".join(sorted(cycle)) for cycle in cycles if not cycle <= FRONT_DOOR_AND_WORKER]
    assert not unknown, "import cycles other than the app and the worker's:\n" + "\n".join(unknown)
    assert len(cycles) <= 1


def test_no_router_imports_another_router() -> None:
    offences = _offences(routers(), routers())
    assert not offences, "\n".join(offences)


def test_the_kernel_imports_no_router_nor_the_assembler_nor_the_dashboard() -> None:
    dashboard = [module for module in graph() if _inside(module, DASHBOARD)]
    offences = _offences([KERNEL], [*routers(), ASSEMBLER, *dashboard])
    assert not offences, "\n".join(offences)


def test_nothing_but_serve_and_the_cli_imports_the_assembler() -> None:
    others = [module for module in graph() if module not in MAY_IMPORT_THE_ASSEMBLER]
    offences = _offences(others, [ASSEMBLER])
    assert not offences, "\n".join(offences)


def test_the_dashboard_imports_no_router_of_the_api() -> None:
    dashboard = [module for module in graph() if _inside(module, DASHBOARD)]
    api_routers = [module for module in routers() if _inside(module, API)]
    offences = _offences(dashboard, [*api_routers, ASSEMBLER])
    assert not offences, "\n".join(offences)


def test_the_api_imports_the_dashboard_only_to_install_it() -> None:
    api = [module for module in graph() if _inside(module, API) and module != ASSEMBLER]
    dashboard = [module for module in graph() if _inside(module, DASHBOARD)]
    offences = _offences(api, dashboard)
    assert not offences, "\n".join(offences)


def test_the_library_imports_neither_the_http_api_nor_the_dashboard() -> None:
    """The domain (runs, figures, access, webhooks, projects...), the worker and storage
    are used by the API, the dashboard and the CLI alike: they import none of them."""
    library = [
        module
        for module in graph()
        if not _inside(module, API)
        and not _inside(module, DASHBOARD)
        and module not in MAY_IMPORT_THE_ASSEMBLER
    ]
    http = [module for module in graph() if _inside(module, API) or _inside(module, DASHBOARD)]
    offences = _offences(library, http)
    assert not offences, "\n".join(offences)
