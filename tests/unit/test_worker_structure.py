"""The worker's shape, checked: no import cycle among its modules (imports at any depth: module level, inside
functions, under TYPE_CHECKING), and protocols.py imports nothing of the worker but the plain values it names
(it declares, it does not implement)."""

from __future__ import annotations

import ast
from pathlib import Path

import jev_worker

WORKER = Path(jev_worker.__file__).resolve().parent


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports, wherever the import statement stands."""
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_the_worker():
    graph = import_graph(WORKER)
    assert len(graph) > 50
    found = cycles(graph)
    assert not found, "import cycles in services/jev_worker:\n" + "\n".join(
        f"{component}: " + "; ".join(f"{m} -> {sorted(graph[m] & set(component))}" for m in component)
        for component in found
    )


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_protocols_import_nothing_of_the_worker():
    """protocols.py imports only the plain values it names (values/), which import nothing else of the worker."""
    graph = import_graph(WORKER)
    assert graph["jev_worker.protocols"] == {"jev_worker.values.datatypes"}, graph["jev_worker.protocols"]
    values = {m for m in graph if m.startswith("jev_worker.values")}
    assert all(graph[m] <= values for m in values), {m: graph[m] - values for m in values}
    assert graph["jev_worker.values.position_prior"] == set()


def test_no_override_detection_and_a_small_runner():
    """What a forward may do is declared by its adapter (protocols.ForwardAdapter), never detected from which
    methods a subclass overrides; the runner only runs batches."""
    found = [
        f"{path.relative_to(WORKER)}"
        for path in WORKER.rglob("*.py")
        if "getattr(type(self)" in path.read_text(encoding="utf-8")
    ]
    assert not found, found
    assert len((WORKER / "engine" / "runner.py").read_text(encoding="utf-8").splitlines()) <= 300


def test_no_family_names_outside_the_worker_families():
    """Family code lives in jev_worker/families/<family>; the shared library and the preencoder name no family (the
    preencoder asks the family registry for a family's own vision model)."""
    import re

    from jev_worker.families.registry import FAMILIES

    generic = {"label-tokens", "code-readout"}
    names = {name for name in FAMILIES if name not in generic}
    names |= {folder.name for folder in (WORKER / "families").iterdir() if (folder / "__init__.py").exists()}
    spelled = {form for name in names for form in (name, name.replace("-", "_"), name.replace("_", "-"))}
    pattern = re.compile(
        r"(?<![\w-])(" + "|".join(sorted(map(re.escape, spelled), key=len, reverse=True)) + r")(?![\w-])", re.IGNORECASE
    )
    found = []
    for package in ("jev_common", "jev_preencoder"):
        for path in sorted((WORKER.parent / package).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                match = pattern.search(line)
                if match:
                    found.append(f"{package}/{path.name}:{number}: {match.group(0)}")
    assert not found, "family names outside jev_worker/families:\n" + "\n".join(found)


def test_the_runner_names_no_prefix_cache_outcome():
    """The scheduler plans what the runner computes and keeps (scheduling/batch.py PrefixGroup); the runner knows
    nothing of how the prefix cache answered."""
    source = (WORKER / "engine" / "runner.py").read_text(encoding="utf-8")
    names = {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)}
    assert not names & {"match", "store", "bypass", "outcome", "Match"}, names & {"match", "store", "bypass", "outcome"}


def room(module: str) -> str:
    """A module's room: its folder under jev_worker (jev_worker.scheduling.batch -> scheduling), or the module itself
    at the top level, where each file is a room of its own (app, service, model, ...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    for targets in list(rooms.values()):
        for target in targets:
            rooms.setdefault(target, set())
    return rooms


def test_no_import_loop_between_the_worker_folders():
    """The folders are the layers: no folder reaches another that reaches back, at any remove (issue 44)."""
    rooms = folder_graph(import_graph(WORKER))
    assert {"scheduling", "engine", "loading", "request", "prompt", "telemetry"} <= set(rooms)
    found = cycles(rooms)
    assert not found, "import loops between the worker's rooms:\n" + "\n".join(
        f"{component}: " + "; ".join(f"{r} -> {sorted(rooms[r] & set(component))}" for r in component)
        for component in found
    )


def test_the_folder_check_sees_a_loop_the_module_check_does_not():
    """Two folders whose modules import each other's other modules: no module cycle, a loop of folders."""
    graph = {
        "jev_worker.a.x": {"jev_worker.b.y"},
        "jev_worker.b.z": {"jev_worker.a.w"},
        "jev_worker.a.w": set(),
        "jev_worker.b.y": set(),
    }
    assert cycles(graph) == []
    assert cycles(folder_graph(graph)) == [["a", "b"]]


def test_the_top_level_stays_small():
    """At most 12 files at services/jev_worker's top level, __init__ and __main__ included (issue 44)."""
    top = sorted(p.name for p in WORKER.glob("*.py"))
    assert len(top) <= 12, top
