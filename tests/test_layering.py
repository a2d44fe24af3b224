"""The package's imports run one way, as docs/layout.md draws them.

Read from the source with ``ast`` (nothing is imported, so this is fast and sees imports under
``TYPE_CHECKING`` too, which a reader of the code sees as well):

* ``client/`` imports nothing of Spark, of ``source/``, ``sink/``, ``embedded/`` or the package
  root: it could be published on its own;
* ``source/`` and ``sink/`` do not import each other;
* ``storage/`` (what is kept under a checkpoint, for both) imports nothing above it;
* nothing shipped imports ``embedded/`` (the test server) except ``demo.py``;
* inside ``client/``, the rooms (``read/``, ``send/``, ``txn/``, ``group/``, ``grpc/``,
  ``filter/``) stand on the plumbing (``client/*.py``, ``protocol/``), which imports no room; a
  room's modules are its own: another room imports only those :data:`ROOM_ARROWS` lists;
* ``source/`` and ``sink/`` hold no wire protocol: no frames, request or answer codes, header
  field names or sockets (those are the client's);
* no module imports itself back, not even lazily or under ``TYPE_CHECKING`` (a type named
  only to annotate belongs in a lower module).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

PACKAGE = "rocketmq_spark"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").relative_to(ROOT.parent).parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of ours (a .py file, a directory or a
    built extension), rather than a name defined in one."""
    path = ROOT.parent / dotted.replace(".", "/")
    return (path.is_dir() or path.with_suffix(".py").exists()
            or any(path.parent.glob(path.name + ".*.so")))


def _imports(path: Path) -> Set[str]:
    """Every module ``path`` imports (absolute dotted names; ``from m import name`` counts as
    ``m.name`` when that is a module, else as ``m``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                found.add(candidate if _is_module(candidate) else module)
    return found


def _graph() -> Dict[str, Set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(ROOT.rglob("*.py"))}


GRAPH = _graph()


def _under(module: str, room: str) -> bool:
    prefix = f"{PACKAGE}.{room}"
    return module == prefix or module.startswith(prefix + ".")


def _offenders(room: str, forbidden) -> List[str]:
    return sorted(f"{module} imports {dep}" for module, deps in GRAPH.items()
                  if _under(module, room) for dep in deps if forbidden(dep))


def test_the_graph_sees_the_package():
    assert f"{PACKAGE}.embedded.broker" in GRAPH
    assert f"{PACKAGE}.embedded.records" in GRAPH[f"{PACKAGE}.embedded.send"]
    assert f"{PACKAGE}.client.protocol.frame" in GRAPH[f"{PACKAGE}.embedded.server"]


def test_client_imports_nothing_above_it():
    def above(dep: str) -> bool:
        return (dep == PACKAGE or dep.split(".")[0] == "pyspark"
                or (dep.startswith(PACKAGE + ".") and not _under(dep, "client")))
    assert _offenders("client", above) == []


def test_storage_imports_nothing_above_it():
    """The checkpoint storage layer serves source/ and sink/: it imports neither, nor Spark,
    nor the rest of the package."""
    def above(dep: str) -> bool:
        return (dep == PACKAGE or dep.split(".")[0] == "pyspark"
                or (dep.startswith(PACKAGE + ".") and not _under(dep, "storage")))
    assert f"{PACKAGE}.storage.lease" in GRAPH
    assert _offenders("storage", above) == []


@pytest.mark.parametrize("room, other", [("source", "sink"), ("sink", "source")])
def test_source_and_sink_do_not_import_each_other(room, other):
    assert _offenders(room, lambda dep: _under(dep, other)) == []


def test_nothing_shipped_imports_the_embedded_server_but_the_demo():
    offenders = sorted(f"{module} imports {dep}" for module, deps in GRAPH.items()
                       if not _under(module, "embedded") and module != f"{PACKAGE}.demo"
                       for dep in deps if _under(dep, "embedded"))
    assert offenders == []


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The import cycles of ``graph`` (one per back edge of a depth-first walk)."""
    state: Dict[str, int] = {}  # 1: on the walk's path, 2: done
    path: List[str] = []
    found: List[List[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                found.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_embedded_server_has_no_import_cycle():
    embedded = {module: {dep for dep in deps if _under(dep, "embedded")}
                for module, deps in GRAPH.items() if _under(module, "embedded")}
    assert [" -> ".join(cycle) for cycle in _cycles(embedded)] == []


def test_the_package_has_no_import_cycle():
    assert [" -> ".join(cycle) for cycle in _cycles(GRAPH)] == []


CLIENT = f"{PACKAGE}.client"
ROOMS = ("read", "send", "txn", "group", "grpc", "filter")
# room -> the other rooms' modules it may import. The gRPC producer is a producer: it takes
# send/'s Message and gives its SendResult, and yields to busy brokers as send/ does.
ROOM_ARROWS = {
    "grpc": {"send.producer", "send.backpressure"},
}


def _room(module: str) -> str:
    """The client room ``module`` belongs to; "" for the plumbing (and outside client/)."""
    if not module.startswith(CLIENT + "."):
        return ""
    first = module[len(CLIENT) + 1:].split(".")[0]
    return first if first in ROOMS else ""


def test_the_client_plumbing_imports_no_room():
    offenders = sorted(f"{module} imports {dep}" for module, deps in GRAPH.items()
                       if _under(module, "client") and not _room(module)
                       for dep in deps if _room(dep))
    assert f"{CLIENT}.broker" in GRAPH and f"{CLIENT}.read.reader" in GRAPH
    assert offenders == []


def test_rooms_import_each_other_only_as_the_table_says():
    offenders = []
    for module, deps in GRAPH.items():
        room = _room(module)
        for dep in deps:
            other = _room(dep)
            if room and other and other != room and \
                    dep[len(CLIENT) + 1:] not in ROOM_ARROWS.get(room, ()):
                offenders.append(f"{module} imports {dep}")
    assert sorted(offenders) == []


# What is wire protocol: frames, request and answer codes, header field names (protocol.codes),
# connections and sockets, and the broker client's request builders.
WIRE_MODULES = {f"{CLIENT}.protocol.frame", f"{CLIENT}.protocol.codes", f"{CLIENT}.connection",
                f"{CLIENT}.transport"}
BROKER_CLIENT_NAMES = {"BrokerClient", "Subscription"}


def _wire_imports(path: Path) -> List[str]:
    """The wire modules ``path`` imports, and what it imports of the broker client other than
    the client itself."""
    found = [dep for dep in _imports(path) if dep in WIRE_MODULES]
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
        else:
            continue
        if module == f"{CLIENT}.broker":
            found += [f"{module}.{a.name}" for a in node.names
                      if a.name not in BROKER_CLIENT_NAMES]
    return found


@pytest.mark.parametrize("room", ["source", "sink"])
def test_source_and_sink_hold_no_wire_protocol(room):
    offenders = sorted(f"{_module_name(path)} imports {dep}"
                       for path in sorted((ROOT / room).rglob("*.py"))
                       for dep in _wire_imports(path))
    assert offenders == []
