"""The shape of the code: no import cycles (function-level imports counted), every module
in an explicit layer that imports only its own layer or lower ones, packages that import
only the packages they may, a thin Truss adapter, and build tooling kept out of the
serving package."""

from __future__ import annotations

import ast
import fnmatch
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = REPO / "mistral-trt-truss" / "packages"
SERVING = PACKAGES / "mistral_serving"
MODEL_PY = PACKAGES.parent / "model" / "model.py"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGES).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path) -> set[str]:
    """Modules of our package imported when `path` is imported (not inside functions,
    not under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                if sub.module.startswith("mistral_serving"):
                    found.add(sub.module)
                    found.update(
                        f"{sub.module}.{a.name}"
                        for a in sub.names
                        if (SERVING.parent / f"{sub.module}.{a.name}".replace(".", "/"))
                        .with_suffix(".py")
                        .exists()
                    )
            elif isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names if a.name.startswith("mistral_serving"))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SERVING.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for dep in top_level_imports(path):
            # `from a.b import c` imports a and a.b (their __init__ too)
            parts = dep.split(".")
            deps.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_finds_a_planted_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_serving_library_has_no_import_cycles() -> None:
    graph = import_graph()
    assert "mistral_serving.http.frontend" in graph and graph["mistral_serving.http.frontend"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_truss_adapter_is_thin_and_only_forwards() -> None:
    source = MODEL_PY.read_text()
    code_lines = [
        line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")
    ]
    assert len(code_lines) <= 60, len(code_lines)
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    ours = {m for m in imported if m.startswith("mistral_serving")}
    assert ours == {"mistral_serving.http.frontend"}, ours  # settings come with its frontend


def test_build_tooling_is_not_in_the_serving_packages() -> None:
    assert not (PACKAGES / "mistral_build").exists()
    for path in SERVING.rglob("*.py"):
        assert "mistral_build" not in path.read_text(), path


# ---- the whole graph: every import anywhere in a module --------------------------------

# Our three packages and where they live.
ROOTS = {
    "mistral_serving": SERVING,
    "mistral_gpu_fallback": PACKAGES / "mistral_gpu_fallback",
    "mistral_build": REPO / "mistral_build",
    "client": REPO / "client",
}

# Which of our packages each may import. The serving library ships alone in the image; the
# client is a library of its own; build tooling drives both.
PACKAGE_DEPS: dict[str, frozenset[str]] = {
    "mistral_serving": frozenset(),
    "mistral_gpu_fallback": frozenset({"mistral_serving"}),
    "client": frozenset(),
    "mistral_build": frozenset({"mistral_serving", "mistral_gpu_fallback", "client"}),
}

# Layers, lowest first, per package: a module imports only from its own layer or lower
# ones. Entries are module names or globs (`*`); an exact name wins over a glob. A new
# module must be placed here (the test says so).
LAYERS: dict[str, Sequence[tuple[str, Sequence[str]]]] = {
    # The serving core in rooms, one concern each, in the order a request goes down: a
    # room imports only itself and the rooms below it (within a room, only cycles are
    # refused). `settings` sits above `ops` for the metric names' prefixes.
    "mistral_serving": (
        ("foundation", ("mistral_serving", "mistral_serving.errors")),
        ("operations", ("mistral_serving.ops", "mistral_serving.ops.*")),
        ("settings", ("mistral_serving.settings",)),
        ("artifacts", ("mistral_serving.artifacts", "mistral_serving.artifacts.*")),
        ("tools", ("mistral_serving.tools", "mistral_serving.tools.*")),
        ("text", ("mistral_serving.text", "mistral_serving.text.*")),
        ("structured output", ("mistral_serving.structured", "mistral_serving.structured.*")),
        ("engines", ("mistral_serving.engines", "mistral_serving.engines.*")),
        ("generation", ("mistral_serving.generation", "mistral_serving.generation.*")),
        ("wire formats", ("mistral_serving.protocols", "mistral_serving.protocols.*")),
        ("http", ("mistral_serving.http", "mistral_serving.http.*")),
    ),
    # The GPU fallback: it imports the core (any room); the core never imports it.
    "mistral_gpu_fallback": (
        (
            "engines",
            (
                "mistral_gpu_fallback",
                "mistral_gpu_fallback.static",
                "mistral_gpu_fallback.static.*",
                "mistral_gpu_fallback.replay",
                "mistral_gpu_fallback.process",
                "mistral_gpu_fallback.process.sharing",
                "mistral_gpu_fallback.process.ipc",
            ),
        ),
        ("engine process", ("mistral_gpu_fallback.process.client",)),
        ("launcher", ("mistral_gpu_fallback.frontends",)),
        ("entry points", ("mistral_gpu_fallback.process.worker", "mistral_gpu_fallback.plugin")),
    ),
    "client": (
        (
            "foundation",
            (
                "client.errors",
                "client.types",
                "client.metrics",
                "client.hostinfo",
                "client.helpformat",
            ),
        ),
        (
            "wire",
            (
                "client.streams",
                "client.protocol",
                "client.rawhttp",
                "client.datasets",
                "client.plots",
            ),
        ),
        ("library", ("client", "client.client")),
        ("commands", ("client.bench",)),
        ("entry points", ("client.cli", "client.__main__", "client.testing")),
    ),
    "mistral_build": (
        (
            "foundation",
            (
                "mistral_build",
                "mistral_build.paths",
                "mistral_build.gpu",
                "mistral_build.torch_index",
                "mistral_build.tokenizer_files",
                "mistral_build.publish",
                "mistral_build.deploy_settings",
                "mistral_build.release",
                "mistral_build.base_constraints",
                "mistral_build.k8s_objects",
            ),
        ),
        ("dev models", ("mistral_build.smollm2", "mistral_build.dev_model")),
        ("local server", ("mistral_build.local_server",)),
        (
            "engines, images, manifests",
            (
                "mistral_build.engine",
                "mistral_build.image",
                "mistral_build.truss_config",
                "mistral_build.k8s",
                "mistral_build.gateway",
                "mistral_build.k8s_weights",
                "mistral_build.k8s_bucket",
                "mistral_build.diagrams",
            ),
        ),
        ("image checks", ("mistral_build.image_installs",)),
        ("verify-gpu", ("mistral_build.verify", "mistral_build.verify.*")),
        ("commands", ("mistral_build.cli", "mistral_build.reference")),
    ),
}

# KNOWN cycles, each to be removed by the change that breaks it (and then from this list:
# a listed cycle that is gone fails the test too). Each is an exact cycle: any further
# import among its modules makes another cycle and fails.
KNOWN_CYCLES: tuple[tuple[str, ...], ...] = ()


def package_modules(roots: Mapping[str, Path]) -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its `__init__`)."""
    found: dict[str, Path] = {}
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = (package, *path.relative_to(root).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (functions, methods, try/except), except under
    `if TYPE_CHECKING:`, which never runs (its `else:` does)."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
        return
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        children: list[ast.AST] = list(node.orelse)
    else:
        children = list(ast.iter_child_nodes(node))
    for child in children:
        yield from _imports(child)


def imported_modules(name: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ours that importing `name` (and calling anything in it) may import.
    `from a.b import c` imports a.b.c when that is a module, else a.b; and the packages on
    the way (a), except the importer's own parents: Python has initialised those first."""
    is_package = path.name == "__init__.py"
    own_parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:  # relative: from the importer's package, up level - 1
            package = name.split(".") if is_package else name.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([node.module] if node.module else []))
        names = {f"{base}.{alias.name}" for alias in node.names}
        targets.update(names & modules.keys())
        if not names <= modules.keys():  # names defined in `base` itself
            targets.add(base)
    found: set[str] = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in own_parents:
                found.add(parent)
        found.add(target)
    return {m for m in found if m in modules and m != name}


def full_import_graph(roots: Mapping[str, Path]) -> dict[str, set[str]]:
    modules = package_modules(roots)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """Tarjan's components with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycle_problems(graph: Mapping[str, set[str]], known: Sequence[Sequence[str]] = ()) -> list[str]:
    """One line per import cycle that is not exactly a known one, and per known one gone."""
    problems = []
    known_sets = {frozenset(cycle): tuple(cycle) for cycle in known}
    seen: set[frozenset[str]] = set()
    for component in strongly_connected(graph):
        edges = sorted((a, b) for a in component for b in graph[a] if b in component)
        cycle = known_sets.get(frozenset(component))
        # A known cycle of n modules is n imports; one more among them is a new cycle.
        if cycle is not None and len(edges) == len(cycle):
            seen.add(frozenset(component))
            continue
        problems.append("import cycle: " + ", ".join(f"{a} -> {b}" for a, b in edges))
    for members, cycle in known_sets.items():
        if members not in seen:
            problems.append(
                f"known cycle gone or changed: {' -> '.join(cycle)} (update KNOWN_CYCLES)"
            )
    return problems


def layer_of(module: str, layers: Sequence[tuple[str, Sequence[str]]]) -> int | None:
    for i, (_, entries) in enumerate(layers):
        if module in entries:
            return i
    for i, (_, entries) in enumerate(layers):
        if any(fnmatch.fnmatchcase(module, entry) for entry in entries if "*" in entry):
            return i
    return None


def layer_problems(
    graph: Mapping[str, set[str]],
    layers: Mapping[str, Sequence[tuple[str, Sequence[str]]]],
    package_deps: Mapping[str, frozenset[str]],
) -> list[str]:
    """One line per module without a layer, per import of a higher layer, and per import of
    a package that the importer's package may not use."""
    problems = []
    for module in sorted(graph):
        package = module.split(".")[0]
        mine = layer_of(module, layers[package])
        if mine is None:
            problems.append(f"{module}: in no layer (place it in LAYERS)")
        for dep in sorted(graph[module]):
            dep_package = dep.split(".")[0]
            if dep_package != package:
                if dep_package not in package_deps[package]:
                    problems.append(f"{module} -> {dep}: {package} may not import {dep_package}")
                continue
            theirs = layer_of(dep, layers[package])
            if mine is not None and theirs is not None and theirs > mine:
                problems.append(
                    f"upward import: {module} ({layers[package][mine][0]}) -> "
                    f"{dep} ({layers[package][theirs][0]})"
                )
    return problems


def test_the_code_has_no_import_cycles_but_the_known_ones() -> None:
    graph = full_import_graph(ROOTS)
    # Function-level imports are followed: these two exist only inside functions.
    assert "mistral_build.k8s" in graph["mistral_build.cli"]
    assert "mistral_serving.engines.factory" in graph["mistral_gpu_fallback.process.worker"]
    assert cycle_problems(graph, KNOWN_CYCLES) == []


def test_every_module_imports_only_its_layer_or_lower_ones() -> None:
    assert layer_problems(full_import_graph(ROOTS), LAYERS, PACKAGE_DEPS) == []


# Engine families: `engines/<family>/` (or one module, `engines/replay.py`). A family's
# modules import their own family and the shared modules, never another family: only the
# factory (a layer above them all) knows every family.
ENGINES = "mistral_serving.engines"
SHARED_ENGINE_MODULES = frozenset(
    {ENGINES, f"{ENGINES}.base", f"{ENGINES}.sampling", f"{ENGINES}.fallback"}
)
ENGINE_CHOICE = frozenset({f"{ENGINES}.factory"})


def family_of(module: str, package: str) -> str | None:
    """`pytorch` for package.pytorch.dynamic, `replay` for package.replay; None outside."""
    if not module.startswith(package + "."):
        return None
    return module[len(package) + 1 :].split(".")[0]


def family_problems(
    graph: Mapping[str, set[str]],
    package: str,
    shared: frozenset[str],
    choice: frozenset[str],
) -> list[str]:
    """One line per import from one engine family into another. The shared modules and
    the choosing ones are no family; an import of a choosing module is the layers' to judge."""
    problems = []
    for module in sorted(graph):
        mine = family_of(module, package)
        if mine is None or module in shared or module in choice:
            continue
        for dep in sorted(graph[module]):
            theirs = family_of(dep, package)
            if theirs is None or dep in shared or dep in choice or theirs == mine:
                continue
            problems.append(f"{module} -> {dep}: engine family {mine} imports family {theirs}")
    return problems


def test_no_engine_family_imports_another() -> None:
    graph = full_import_graph(ROOTS)
    families = {family_of(m, ENGINES) for m in graph} - {None}
    assert {"pytorch", "trtllm"} <= families
    assert family_problems(graph, ENGINES, SHARED_ENGINE_MODULES, ENGINE_CHOICE) == []


# ---- the checks themselves, on planted packages -----------------------------------------


def plant(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    """A package `pkg` under `root` with the given modules (path -> source)."""
    for rel, source in {"__init__.py": "", **files}.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return {"pkg": root / "pkg"}


PLANTED_LAYERS = {
    "pkg": (("low", ("pkg", "pkg.low", "pkg.sub", "pkg.sub.*")), ("high", ("pkg.high",)))
}


def test_a_planted_function_level_cycle_is_found(tmp_path: Path) -> None:
    roots = plant(
        tmp_path,
        {
            "low.py": "def f():\n    from pkg import high\n    return high\n",
            "high.py": "import pkg.low\n",
        },
    )
    graph = full_import_graph(roots)
    assert graph["pkg.low"] == {"pkg.high"} and graph["pkg.high"] == {"pkg.low"}
    assert cycle_problems(graph) == ["import cycle: pkg.high -> pkg.low, pkg.low -> pkg.high"]
    # Known, it passes; one more import among its modules is a new cycle.
    assert cycle_problems(graph, [("pkg.low", "pkg.high")]) == []
    graph["pkg.low"].add("pkg.low")
    assert len(cycle_problems(graph, [("pkg.low", "pkg.high")])) == 2


def test_a_planted_cycle_through_relative_and_nested_imports_is_found(tmp_path: Path) -> None:
    roots = plant(
        tmp_path,
        {
            "sub/__init__.py": "",
            "sub/a.py": "class C:\n    def m(self):\n        try:\n            from . import b\n"
            "        except ImportError:\n            pass\n",
            "sub/b.py": "from ..sub.a import C\n",
        },
    )
    graph = full_import_graph(roots)
    assert graph["pkg.sub.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.a"}
    assert len(cycle_problems(graph)) == 1


def test_imports_under_type_checking_do_not_count(tmp_path: Path) -> None:
    roots = plant(
        tmp_path,
        {
            "low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import high\n",
            "high.py": "import pkg.low\n",
        },
    )
    graph = full_import_graph(roots)
    assert graph["pkg.low"] == set()
    assert cycle_problems(graph) == []
    # Its else branch runs, and so does `if not TYPE_CHECKING:`.
    for source in (
        "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    import pkg.high\n",
        "from typing import TYPE_CHECKING\nif not TYPE_CHECKING:\n    import pkg.high\n",
    ):
        (tmp_path / "pkg" / "low.py").write_text(source)
        assert full_import_graph(roots)["pkg.low"] == {"pkg.high"}, source


def test_a_known_cycle_that_is_gone_fails(tmp_path: Path) -> None:
    roots = plant(tmp_path, {"low.py": "", "high.py": "import pkg.low\n"})
    assert cycle_problems(full_import_graph(roots), [("pkg.low", "pkg.high")]) == [
        "known cycle gone or changed: pkg.low -> pkg.high (update KNOWN_CYCLES)"
    ]


def test_a_planted_upward_import_is_found(tmp_path: Path) -> None:
    roots = plant(
        tmp_path,
        {"low.py": "def f():\n    import pkg.high\n", "high.py": "", "sub/__init__.py": ""},
    )
    graph = full_import_graph(roots)
    assert layer_problems(graph, PLANTED_LAYERS, {"pkg": frozenset()}) == [
        "upward import: pkg.low (low) -> pkg.high (high)"
    ]


def test_a_module_in_no_layer_and_a_forbidden_package_are_found(tmp_path: Path) -> None:
    roots = plant(tmp_path, {"low.py": "", "high.py": "", "stray.py": "import other.x\n"})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "__init__.py").write_text("")
    (tmp_path / "other" / "x.py").write_text("")
    roots["other"] = tmp_path / "other"
    graph = full_import_graph(roots)
    layers = {**PLANTED_LAYERS, "other": (("all", ("other", "other.*")),)}
    deps = {"pkg": frozenset(), "other": frozenset()}
    assert layer_problems(graph, layers, deps) == [
        "pkg.stray: in no layer (place it in LAYERS)",
        "pkg.stray -> other: pkg may not import other",
        "pkg.stray -> other.x: pkg may not import other",
    ]


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_the_layers_name_only_modules_that_exist(package: str) -> None:
    modules = package_modules(ROOTS)
    named = [e for _, entries in LAYERS[package] for e in entries if "*" not in e]
    assert [e for e in named if e not in modules] == []


def test_a_planted_import_from_one_family_into_another_is_found(tmp_path: Path) -> None:
    roots = plant(
        tmp_path,
        {
            "base.py": "",
            "choose.py": "import pkg.a.x\nimport pkg.b\n",
            "a/__init__.py": "",
            "a/x.py": "import pkg.base\nfrom . import y\n",
            "a/y.py": "def f():\n    from pkg.b import z\n",
            "b/__init__.py": "",
            "b/z.py": "import pkg.choose\n",
        },
    )
    graph = full_import_graph(roots)
    shared, choice = frozenset({"pkg", "pkg.base"}), frozenset({"pkg.choose"})
    assert family_problems(graph, "pkg", shared, choice) == [
        "pkg.a.y -> pkg.b: engine family a imports family b",
        "pkg.a.y -> pkg.b.z: engine family a imports family b",
    ]


def _serving_copy(tmp_path: Path) -> dict[str, Path]:
    """The real serving core and GPU fallback, copied: the real LAYERS and PACKAGE_DEPS
    then judge a planted import."""
    roots = {}
    for package in ("mistral_serving", "mistral_gpu_fallback"):
        roots[package] = tmp_path / package
        shutil.copytree(
            ROOTS[package], roots[package], ignore=shutil.ignore_patterns("__pycache__")
        )
    return roots


def plant_function(path: Path, body: str) -> None:
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {body}\n")


def test_the_real_tree_with_a_planted_upward_import_fails(tmp_path: Path) -> None:
    roots = _serving_copy(tmp_path)
    plant_function(
        roots["mistral_serving"] / "engines" / "base.py",
        "from mistral_serving.http.frontend import Frontend",
    )
    graph = full_import_graph(roots)
    assert (
        "upward import: mistral_serving.engines.base (engines) -> "
        "mistral_serving.http.frontend (http)"
    ) in layer_problems(graph, LAYERS, PACKAGE_DEPS)
    assert any(
        "mistral_serving.engines.base -> mistral_serving.http.frontend" in p
        for p in cycle_problems(graph)
    )


def test_the_real_tree_with_the_core_importing_the_fallback_fails(tmp_path: Path) -> None:
    roots = _serving_copy(tmp_path)
    plant_function(
        roots["mistral_serving"] / "engines" / "factory.py",
        "from mistral_gpu_fallback.static import engine",
    )
    assert (
        "mistral_serving.engines.factory -> mistral_gpu_fallback.static.engine: "
        "mistral_serving may not import mistral_gpu_fallback"
    ) in layer_problems(full_import_graph(roots), LAYERS, PACKAGE_DEPS)


def test_the_core_names_the_fallback_package_in_one_place_only() -> None:
    """Beyond static imports: no string, no importlib call elsewhere reaches it."""
    naming = sorted(
        str(path.relative_to(SERVING))
        for path in SERVING.rglob("*.py")
        if "mistral_gpu_fallback" in path.read_text()
    )
    assert naming == ["engines/fallback.py"]


def test_the_real_tree_with_planted_imports_among_engines_fails(tmp_path: Path) -> None:
    roots = _serving_copy(tmp_path)
    plant_function(  # the proxy reaching the child's entry point
        roots["mistral_gpu_fallback"] / "process" / "client.py",
        "from mistral_gpu_fallback.process import worker",
    )
    plant_function(
        roots["mistral_serving"] / "engines" / "pytorch" / "dynamic.py",
        "import mistral_serving.engines.trtllm.engine",
    )
    graph = full_import_graph(roots)
    layers = layer_problems(graph, LAYERS, PACKAGE_DEPS)
    assert (
        "upward import: mistral_gpu_fallback.process.client (engine process) "
        "-> mistral_gpu_fallback.process.worker (entry points)"
    ) in layers
    assert family_problems(graph, ENGINES, SHARED_ENGINE_MODULES, ENGINE_CHOICE) == [
        "mistral_serving.engines.pytorch.dynamic -> mistral_serving.engines.trtllm: "
        "engine family pytorch imports family trtllm",
        "mistral_serving.engines.pytorch.dynamic -> mistral_serving.engines.trtllm.engine: "
        "engine family pytorch imports family trtllm",
    ]
