"""The package layers of docs/architecture.md, enforced: every import of every module under pipeline/specbuild
(function-level imports included) goes to its own layer or one below, and no module imports itself back.

A module's layer is that of the longest prefix in LAYERS; a new module or package must be placed there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pipeline"

# Bottom to top; the same table is the picture in docs/architecture.md.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("specbuild", "specbuild.errors", "specbuild.progress"),  # the package root holds only __version__
    (
        "specbuild.config",
        "specbuild.quantization",
        "specbuild.backends",
        "specbuild.families",
        "specbuild.drafters",
        "specbuild.gpus",
    ),
    ("specbuild.artifacts", "specbuild.hfmodel", "specbuild.corpus"),
    ("specbuild.speculative",),
    ("specbuild.decode",),
    ("specbuild.contract",),
    ("specbuild.check",),
    ("specbuild.reference",),
    ("specbuild.triton.client",),
    ("specbuild.session",),
    ("specbuild.example", "specbuild.bench"),
    ("specbuild.engines", "specbuild.convert", "specbuild.triton", "specbuild.llmapi"),
    ("specbuild.paths",),
    ("specbuild.up", "specbuild.deploy"),
    ("specbuild.cli", "specbuild.__main__"),
)

# Inside the stages' band, bottom to top: a stage imports only stages before it here. `check` (the facts about a pair
# that every stage reads) sits below the band; the LLM API path reuses convert's export and verification; `triton`
# serves either repository kind. The paths above the band (`specbuild.paths`) plan each backend's stages; `up` and
# `deploy` (the Helm chart) ask them.
STAGE_ORDER = ("specbuild.convert", "specbuild.engines", "specbuild.llmapi", "specbuild.triton")


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "specbuild").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = modules()


def layer(module: str) -> int:
    best, found = -1, None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), index
    if found is None:
        raise AssertionError(f"{module} is in no layer of LAYERS: add it to the table (and to docs/architecture.md)")
    return found


def ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]  # specbuild.a, specbuild.a.b (not the root)


def direct_imports(module: str) -> set[str]:
    """The specbuild modules `module` imports anywhere in its file (`from X import m` counts X.m when m is a
    module, else X)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith("specbuild") and name != module:
                out.add(name)
    return out


DIRECT = {module: direct_imports(module) for module in MODULES}


def imports(module: str) -> set[str]:
    """`direct_imports`, plus the packages whose __init__ such an import runs first when that __init__ imports
    specbuild modules itself (a docstring-only __init__ can neither cycle nor reach up); a module's own
    packages are not counted (they are already being imported)."""
    own = ancestors(module) + [module]
    return DIRECT[module] | {
        a for name in DIRECT[module] for a in ancestors(name) if a in MODULES and DIRECT[a] and a not in own
    }


GRAPH = {module: imports(module) for module in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_from_a_layer_above_it(module):
    above = sorted(name for name in GRAPH[module] if layer(name) > layer(module))
    assert not above, f"{module} (layer {layer(module)}) imports from layers above it: {above}"


def stage(module: str) -> int | None:
    return next((i for i, name in enumerate(STAGE_ORDER) if module == name or module.startswith(name + ".")), None)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) == layer("specbuild.convert")))
def test_no_stage_imports_a_stage_after_it(module):
    after = sorted(
        name
        for name in GRAPH[module]
        if layer(name) == layer(module)
        and stage(name) is not None
        and stage(module) is not None
        and stage(name) > stage(module)
    )
    assert not after, f"{module} imports stages after it in STAGE_ORDER: {after}"


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for name in sorted(GRAPH[module]):
            if state.get(name) == 1:
                cycles.append(path[path.index(name) :] + [name])
            elif name not in state:
                visit(name, path + [name])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_violation_and_a_cycle(monkeypatch):
    """The two checks can fail: an upward import and a cycle planted in the graph are caught."""
    monkeypatch.setitem(GRAPH, "specbuild.speculative.loop", GRAPH["specbuild.speculative.loop"] | {"specbuild.cli"})
    with pytest.raises(AssertionError, match=r"imports from layers above it: \['specbuild.cli'\]"):
        test_no_module_imports_from_a_layer_above_it("specbuild.speculative.loop")
    monkeypatch.setitem(GRAPH, "specbuild.convert.plan", GRAPH["specbuild.convert.plan"] | {"specbuild.triton.configs"})
    with pytest.raises(AssertionError, match=r"stages after it in STAGE_ORDER: \['specbuild.triton.configs'\]"):
        test_no_stage_imports_a_stage_after_it("specbuild.convert.plan")
    monkeypatch.setitem(GRAPH, "specbuild.errors", GRAPH["specbuild.errors"] | {"specbuild.config"})
    with pytest.raises(AssertionError, match=r"specbuild.config -> (\S+ -> )?specbuild.errors -> specbuild.config"):
        test_no_import_cycles()


def test_the_architecture_page_shows_this_table():
    """docs/architecture.md's table has one row per layer of LAYERS, in order, naming exactly its packages."""
    import re

    page = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| ([^|]+) \|", page, re.M)}
    assert sorted(rows) == list(range(len(LAYERS))), sorted(rows)
    for index, names in enumerate(LAYERS):
        shown = set(re.findall(r"`([\w.]+)`", rows[index]))
        wanted = {name.removeprefix("specbuild.") if name != "specbuild" else "specbuild" for name in names}
        assert wanted <= shown, f"layer {index}: the page names {sorted(shown)}, LAYERS {sorted(wanted)}"
