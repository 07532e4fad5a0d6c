"""The package's structure, drawn from its imports: no cycles, package-internal imports at the top
of each file, and only heavy third-party libraries deferred, each with its reason."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "phaze"
HEAVY = {"optuna", "matplotlib", "plotly", "ortools", "scipy", "pandas", "torch"}


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.glob("*.py"))}


def _internal(node: ast.AST, modules) -> set[str]:
    if isinstance(node, ast.ImportFrom) and node.level == 1:
        return {node.module.split(".")[0]} if node.module else {a.name for a in node.names} & set(modules)
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("phaze"):
        return {(node.module + ".").split(".")[1] or "__init__"}
    return set()


def _local_imports(tree: ast.Module):
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield fn, node


def test_no_import_cycles():
    modules = _modules()
    edges = {m: set() for m in modules}
    for m, tree in modules.items():
        for node in ast.walk(tree):                 # function-local imports count too
            edges[m] |= _internal(node, modules) - {m}
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(edges[m]):
            assert state.get(n) != 1, "import cycle: " + " -> ".join([*path, m, n])
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2
    for m in modules:
        if m not in state:
            visit(m, [])


def test_package_imports_are_at_the_top_of_each_file():
    modules = _modules()
    hidden = [f"phaze/{m}.py:{node.lineno} in {fn.name}()" for m, tree in modules.items()
              for fn, node in _local_imports(tree) if _internal(node, modules)]
    assert not hidden, "package-internal imports inside functions: " + ", ".join(hidden)


def test_only_heavy_libraries_are_deferred_each_with_its_reason():
    bad = []
    for p in sorted(PACKAGE.glob("*.py")):
        lines = p.read_text(encoding="utf-8").splitlines()
        reasoned: set[tuple[str, str]] = set()
        for fn, node in _local_imports(ast.parse("\n".join(lines))):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            top = names[0].split(".")[0]
            where = f"phaze/{p.name}:{node.lineno}"
            if top not in HEAVY:
                bad.append(f"{where} defers {top}, which is not a heavy library")
            elif "#" in lines[node.lineno - 1]:
                reasoned.add((fn.name, top))
            elif (fn.name, top) not in reasoned:
                bad.append(f"{where} defers {top} without a reason")
    assert not bad, "; ".join(bad)


PIPELINE = ("base", "model", "cost", "placement", "search", "report")
# the one import against the flow, each with its reason (docs/design.md says why)
AGAINST_THE_FLOW = {("search", "study_files")}   # a search writes its files inside Ctrl-C's wait


def _stages() -> dict[str, str]:
    """Each module's stage, from docs/design.md's module table."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text(encoding="utf-8")
    return {m: s for s, m in re.findall(r"^\| ([a-z ]+?) \| `phaze/(\w+)\.py` \|", text, re.M)}


def _flow_errors(edges, stage) -> list[str]:
    rank = {s: i for i, s in enumerate(PIPELINE)}
    bad = []
    for m, deps in sorted(edges.items()):
        for d in sorted(deps):
            a, b = stage.get(m), stage.get(d)
            if a == "on top" or (m, d) in AGAINST_THE_FLOW:
                continue
            if b == "on top" or (a == "validation" and b not in ("validation", *PIPELINE[:4])) or \
                    (a in rank and (b == "validation" or rank[b] > rank[a])):
                bad.append(f"phaze/{m}.py ({a}) imports phaze/{d}.py ({b})")
    return bad


def test_modules_import_in_the_order_data_flows():
    # model -> cost -> placement -> search -> report, validation beside them (it reads up to the
    # placement; nothing of the pipeline reads it), the CLI and the API on top
    modules = _modules()
    stage = _stages()
    assert set(stage) == set(modules) - {"__init__"}
    assert set(stage.values()) == {*PIPELINE, "validation", "on top"}
    stage["__init__"] = "on top"        # the package's front: what ``import phaze`` gives
    edges = {m: set().union(*(_internal(n, modules) for n in ast.walk(tree))) - {m} for m, tree in modules.items()}
    assert not _flow_errors(edges, stage)
    for edge in AGAINST_THE_FLOW:       # each exception still needed
        assert edge[1] in edges[edge[0]]
    # the check can fail: the search reading published runs, the cost model reading the search
    assert _flow_errors({"area": {"runs"}, "step": {"space"}, "runs": {"space"}}, stage) == [
        "phaze/area.py (search) imports phaze/runs.py (validation)",
        "phaze/runs.py (validation) imports phaze/space.py (search)",
        "phaze/step.py (cost) imports phaze/space.py (search)"]
