"""The package's structure, drawn from its imports: no cycles, package-internal imports at the top
of each file, and only heavy third-party libraries deferred, each with its reason."""
from __future__ import annotations

import ast
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


def test_the_search_and_its_report_never_import_the_validation():
    # the search, the cost model and the report read the shipped calibration (phaze.calibrate);
    # reading published runs as cases, fitting and scoring them (runs, validate, fitstore) sit
    # beside the pipeline, so a design search never loads them (docs/design.md's module table)
    modules = _modules()
    edges = {m: set().union(*(_internal(n, modules) for n in ast.walk(tree))) - {m} for m, tree in modules.items()}
    validation = {"runs", "validate", "fitstore"}
    for top in ("api", "candidate", "space", "search", "exact", "bounds", "area", "power", "report",
                "study_files", "placement", "step"):
        seen, todo = set(), [top]
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += edges[m]
        assert not seen & validation, f"phaze/{top}.py imports {sorted(seen & validation)}"
    # and the check can fail: the command line reads published runs
    assert "runs" in edges["cli"]
