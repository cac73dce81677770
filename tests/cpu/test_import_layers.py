"""The package's imports follow the allowed-edge table of docs/architecture.md, and no import cycle exists.

Every import of a deepgemm module counts, at module level and inside functions, so an import moved into a function
cannot hide an upward edge or a cycle.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "deepgemm"
TABLE = ROOT / "docs" / "architecture.md"
LEAVES = {"errors", "utils", "env"}
# (importing file, imported module): imports inside functions that load an optional dependency on demand.
LAZY_ALLOWED = {("deepgemm/commands/report.py", "deepgemm.bench.plots")}


def allowed_table() -> dict[str, set[str]]:
    """layer -> the layers it may import, from the table in docs/architecture.md."""
    text = TABLE.read_text()
    section = text[text.index("## Allowed imports"):]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 2 or cells[0] in ("layer", "---") or set(cells[0]) <= {"-"}:
            continue
        layer = re.findall(r"`([^`]+)`", cells[0])
        allowed = set(re.findall(r"`([^`]+)`", cells[1]))
        if "leaves" in cells[1]:
            allowed |= LEAVES
        if cells[0].startswith("leaves"):
            for leaf in layer:
                table[leaf] = set()
        else:
            table[layer[0]] = allowed
    return table


def layer_of(relative: str) -> str:
    """The layer a package file (path relative to deepgemm/, '/'-separated) belongs to."""
    parts = relative.removesuffix(".py").split("/")
    if parts == ["__init__"]:
        return "root"
    if parts[0] in ("cli", "__main__"):
        return "cli"
    if parts[0] == "kernels":
        return "kernels/common" if len(parts) == 2 or parts[1] == "common" else "kernels/<family>"
    return parts[0]


def family_of(relative: str) -> str | None:
    parts = relative.split("/")
    return parts[1] if parts[0] == "kernels" and len(parts) > 2 and parts[1] != "common" else None


def module_file(module: str) -> str | None:
    """The package file (relative to deepgemm/) a dotted module name refers to."""
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return "/".join(parts) + ".py"
    if (path / "__init__.py").is_file():
        return "/".join([*parts, "__init__.py"]) if parts else "__init__.py"
    return None


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    """(module, line, inside a function) for every deepgemm import of a file; `from deepgemm.x import y` counts y
    when y is itself a module."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names if a.name.split(".")[0] == "deepgemm")
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module and \
                    child.module.split(".")[0] == "deepgemm":
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    found.append((sub if module_file(sub) is not None else child.module, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def package_graph() -> dict[str, list[tuple[str, int, bool]]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        edges = []
        for module, line, lazy in imports_of(path):
            target = module_file(module)
            assert target is not None, f"deepgemm/{relative}:{line} imports {module}, which is no module of the package"
            edges.append((target, line, lazy))
        graph[relative] = edges
    return graph


def test_the_table_covers_every_layer() -> None:
    table = allowed_table()
    layers = {layer_of(path) for path in package_graph()}
    assert layers <= set(table), f"layers missing from docs/architecture.md: {layers - set(table)}"
    assert table["errors"] == set() and table["jit"] == LEAVES


def test_imports_follow_the_allowed_edges() -> None:
    table = allowed_table()
    violations = []
    for source, edges in package_graph().items():
        src_layer = layer_of(source)
        for target, line, lazy in edges:
            dst_layer = layer_of(target)
            where = f"deepgemm/{source}:{line} -> deepgemm/{target}"
            if lazy and (f"deepgemm/{source}", "deepgemm." + target.removesuffix(".py").replace("/", ".")) not in LAZY_ALLOWED:
                violations.append(f"{where}: import inside a function")
            if dst_layer == src_layer:
                if family_of(source) != family_of(target):
                    violations.append(f"{where}: one kernel family imports another")
                continue
            allowed = {"kernels/<family>", "kernels/common"} if "kernels" in table[src_layer] else set()
            if dst_layer not in table[src_layer] | allowed:
                violations.append(f"{where}: {src_layer} may not import {dst_layer}")
    assert not violations, "\n".join(violations)


def test_no_import_cycles() -> None:
    graph = {source: sorted({target for target, _, _ in edges}) for source, edges in package_graph().items()}
    # A file's package __init__ runs first when it is imported; edges to it are real too.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strongconnect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, []):
            if target not in index:
                strongconnect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, []):
                cycles.append(component)

    for node in graph:
        if node not in index:
            strongconnect(node)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_upward_edges_and_cycles(tmp_path: Path) -> None:
    """The parser finds imports at module level and inside functions (so the tests above can fail)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from deepgemm.api import gemm\n\ndef f():\n    from deepgemm.kernels.common import device\n")
    assert imports_of(probe) == [("deepgemm.api.gemm", 1, False), ("deepgemm.kernels.common.device", 4, True)]
    table = allowed_table()
    assert "api" not in table["kernels/<family>"] and "tuning" not in table["kernels/<family>"]
    assert layer_of("kernels/sm90_fp8_gemm_1d2d/plan.py") == "kernels/<family>"
    assert layer_of("kernels/common/device.py") == "kernels/common"
