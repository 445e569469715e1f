"""The shape of the serving library: no import cycles, a thin Truss adapter, and build
tooling kept out of the serving package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2] / "mistral-trt-truss" / "packages"
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
    assert "mistral_serving.frontend" in graph and graph["mistral_serving.frontend"]
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
    assert ours == {"mistral_serving.frontend", "mistral_serving.settings"}, ours


def test_build_tooling_is_not_in_the_serving_packages() -> None:
    assert not (PACKAGES / "mistral_build").exists()
    for path in SERVING.rglob("*.py"):
        assert "mistral_build" not in path.read_text(), path
