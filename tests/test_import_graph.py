"""No import cycles between graft's modules, counting imports inside functions too: a
lazy import that closes a loop is still a loop in the design (who depends on whom)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("graft", "encoders", "adapters", "serving", "kernels", "evals", "benchmarks")


def _modules() -> dict[str, Path]:
    """graft.* module name -> file (the top-level folders install as graft.<folder>)."""
    mods = {}
    for top in PACKAGES:
        for path in (REPO / top).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            parts = parts if parts[0] == "graft" else ["graft", *parts]
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _imports(tree: ast.AST, mods: dict[str, Path]) -> set[str]:
    """Our modules a file imports anywhere in it; `from pkg import sub` counts pkg.sub only
    (the package itself is already loading when its submodule runs)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found.update(s for s in subs if s in mods)
            if not all(s in mods for s in subs):
                found.add(node.module)
    return {m for m in found if m in mods}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def test_no_import_cycles():
    mods = _modules()
    graph = {m: _imports(ast.parse(p.read_text()), mods) - {m} for m, p in mods.items()}
    assert _cycles(graph) == []


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_engine_side_never_imports_the_http_layer():
    """The engine core, the models and the multimodal front raise domain errors
    (graft.errors); only serving/http maps them to status codes."""
    mods = _modules()
    below = ("graft.serving.engine", "graft.serving.models", "graft.serving.multimodal",
             "graft.kernels")
    found = {m: sorted(i for i in _imports(ast.parse(p.read_text()), mods)
                       if i.startswith("graft.serving.http"))
             for m, p in mods.items() if m.startswith(below)}
    assert {m: i for m, i in found.items() if i} == {}
