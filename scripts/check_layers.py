"""The layers contract: every module of the engine and the UI belongs to a layer, nothing imports a layer above
its own, and no modules import each other in a circle. Every import counts: inside functions (a lazy import is
still an import) and under ``if TYPE_CHECKING:`` (a type a layer names is a dependency, even if it never runs).
A model held elsewhere is a session factory, not a subclass: `LoadedModel` is subclassed nowhere outside
`safe_engine.models` (`SEALED`).

    python -m scripts.check_layers [ROOT]

Prints one line per breach and exits 1, or prints a summary and exits 0. `--table` prints the layers as the
Markdown table docs/architecture.md holds (tests/test_layers.py checks the page holds it, so the page and LAYERS
never disagree); CI runs both through that test.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("safe_engine", "components")
LAYERS: tuple[tuple[str, ...], ...] = (  # bottom first; a module belongs to the layer of its longest prefix
    ("safe_engine.contract", "safe_engine.data"),  # data: the files the engine ships, no imports
    ("safe_engine.tokenization",),
    ("safe_engine.runtime",),
    ("safe_engine.models",),
    ("safe_engine.decisions",),
    ("safe_engine.run",),
    ("safe_engine.strategies",),
    ("safe_engine.orchestration",),
    ("safe_engine.analysis", "safe_engine.bench"),
    ("safe_engine.pages",),  # the HTML renderers the app, the CLI, pages and notebooks share
    ("safe_engine.distributed", "safe_engine.remote"),
    ("safe_engine.options",),
    ("safe_engine.integrations",),
    ("safe_engine.server",),
    ("safe_engine.cli", "safe_engine.__main__"),
    ("safe_engine$",),  # the package's own __init__ only ($: this module, not its submodules): the public API
    ("components",),  # the UI consumes the engine; the engine never imports it
)
FORBIDDEN_IN_ENGINE = ("gradio", "components")  # no UI imports in safe_engine/
SEALED = {"LoadedModel": "safe_engine.models"}  # class -> the only package that may subclass it


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (the longest project module the import names)
    line: int


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found[module_name(root, path)] = path
    return found


def imports(root: Path, name: str, path: Path, known: dict[str, Path]) -> tuple[list[Edge], list[str]]:
    """The project modules `name` imports (at any depth of its code) and the third-party roots it names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    edges, external = [], []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif node.level:
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        named = [t for t in targets if t in known]
        if named:
            edges.append(Edge(name, max(named, key=len), node.lineno))
        else:
            external.append(targets[-1].split(".")[0])
    return edges, external


def sealed_subclasses(name: str, path: Path) -> list[tuple[str, str, int]]:
    """(class, sealed base, line) for each class of the module that subclasses a `SEALED` class outside its package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ClassDef):
            continue
        for base in node.bases:
            base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            home = SEALED.get(base_name)
            if home is not None and not (name == home or name.startswith(home + ".")):
                found.append((node.name, base_name, node.lineno))
    return found


def layer_of(name: str) -> int:
    best, index = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix.endswith("$")
            prefix = prefix.rstrip("$")
            if (name == prefix or not exact and name.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    return index


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a list of module names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def breaches(root: Path) -> list[str]:
    """Every way the tree at `root` breaks the contract, one line each (empty when it holds)."""
    known = modules(root)
    problems, graph = [], {}
    for name, path in known.items():
        layer = layer_of(name)
        if layer < 0:
            problems.append(f"{path.relative_to(root)}: belongs to no layer (add it to LAYERS)")
            continue
        edges, external = imports(root, name, path, known)
        graph[name] = {e.target for e in edges if e.target != name}
        for edge in edges:
            if layer_of(edge.target) > layer:
                problems.append(
                    f"{path.relative_to(root)}:{edge.line}: {name} (layer {layer}) imports {edge.target} "
                    f"(layer {layer_of(edge.target)}), a layer above its own"
                )
        for cls, base, line in sealed_subclasses(name, path):
            problems.append(
                f"{path.relative_to(root)}:{line}: {cls} subclasses {base}, sealed to {SEALED[base]}: "
                "supply a session factory (contract.sessions.Sessions) instead"
            )
        if name.startswith("safe_engine"):
            for root_name in sorted(set(external) & set(FORBIDDEN_IN_ENGINE)):
                problems.append(f"{path.relative_to(root)}: the engine imports {root_name}, a UI package")
    for component in cycles(graph):
        problems.append("import cycle: " + " -> ".join(component))
    return problems


def _place(root: Path, prefix: str) -> tuple[str, list[str]]:
    """A layer's prefix as the page names it (linked), and the modules in it (file names, none for one module)."""
    name = prefix.rstrip("$")
    folder = root / name.replace(".", "/")
    if prefix.endswith("$"):
        target = f"{name.replace('.', '/')}/__init__.py"
        return f"[`{target}`](../{target})", []
    if folder.is_dir():
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.py") if p.name != "__init__.py")
        label = f"{name.split('.')[-1]}/" if "." in name else f"{name}/"
        return f"[`{label}`](../{folder.relative_to(root).as_posix()}/)", files
    target = f"{name.replace('.', '/')}.py"
    return f"[`{target.split('/')[-1]}`](../{target})", []


def table(root: Path) -> str:
    """The layers, bottom first, as docs/architecture.md shows them: what each holds, from LAYERS and the tree."""
    lines = ["| # | layer | modules |", "|---|---|---|"]
    for number, prefixes in enumerate(LAYERS, 1):
        places = [_place(root, prefix) for prefix in prefixes]
        files = ", ".join(f"`{f}`" for _, found in places for f in found) or "—"
        lines.append(f"| {number} | {', '.join(label for label, _ in places)} | {files} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.check_layers", description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--table", action="store_true", help="print the layers as docs/architecture.md's table")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    if args.table:
        print(table(root))
        return 0
    problems = breaches(root)
    for line in problems:
        print(line)
    if not problems:
        print(f"layers hold: {len(modules(root))} modules in {len(LAYERS)} layers, no upward import, no cycle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
