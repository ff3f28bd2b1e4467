"""The package's imports point one way: no circle, each layer imports only those below it, no layer imports a
command, leaves import only leaves, and reading a report loads neither torch nor Lightning."""

import ast
import re
import subprocess
import sys

from helpers import ROOT

PACKAGE = ROOT / "nplm_repro"
SUBPACKAGES = ("paper", "data", "models", "baselines", "storage", "serving", "tracking", "sweeping", "reporting")


def imports() -> dict[str, set[str]]:
    """Each nplm_repro module and the nplm_repro modules it imports, at any depth of its code."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nplm_repro"):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("nplm_repro")}
        graph[name] = found
    return graph


def test_the_import_graph_has_no_circle() -> None:
    graph = imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path[path.index(module) :], module))}"
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def layer_of(module: str) -> str:
    """Where a module sits: its subpackage (`data` for nplm_repro.data.text), else its own name (`cli`, `errors`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def commands() -> set[str]:
    """The command modules, on top of every layer: each console script's ([project.scripts], read as text: tomllib
    is Python 3.11's), and cli.py and checks.py, which wrap a command and check its job before it runs."""
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    return set(re.findall(r'^[\w-]+ = "nplm_repro\.(\w+):\w+"$', scripts, re.MULTILINE)) | {"cli", "checks"}


def test_dependencies_point_one_way() -> None:
    """data <- models/baselines <- storage (the MLflow store) <- serving (recorded models rebuilt, scored, served)
    <- tracking (the run ledger) <- sweeping (Hydra sweeps, the search); reporting reads runs and paper facts, never
    models."""
    rank = {
        "paper": 0,
        "data": 1,
        "models": 2,
        "baselines": 3,
        "storage": 4,
        "serving": 5,
        "tracking": 6,
        "sweeping": 7,
    }
    for module, imported in imports().items():
        layer = layer_of(module)
        for other in imported:
            theirs = layer_of(other)
            if layer in rank and theirs in rank:
                assert rank[theirs] <= rank[layer], f"{module} imports {other}"
            if layer == "reporting":
                assert theirs not in ("models", "baselines"), f"{module} imports {other}"
            if layer == "baselines":  # a mixture is arithmetic on kept scores: it never runs a model
                assert theirs != "models", f"{module} imports {other}"


def test_only_serving_imports_both_models_and_baselines() -> None:
    """Rebuilding a recorded run of any family is serving/'s job; every other layer reaches a family through the
    contract (nplm_repro/family.py), so none needs both the trained and the counted models."""
    reached: dict[str, set[str]] = {}
    for module, imported in imports().items():
        if layer_of(module) in SUBPACKAGES:
            reached.setdefault(layer_of(module), set()).update(layer_of(o) for o in imported)
    both = sorted(layer for layer, theirs in reached.items() if {"models", "baselines"} <= theirs - {layer})
    assert both == ["serving"], f"layers importing both models/ and baselines/: {both}"


def test_no_layer_imports_a_command() -> None:
    """The commands (nplm-train's train.py, ..., cli.py, checks.py) sit on top: no subpackage and no leaf imports one,
    so no layer reaches back up into the code that runs it (a sweep reaches nplm-report's writer through
    conf/config.yaml's `report_with`, a name, not an import)."""
    top = commands()
    assert {"train", "report", "bench", "score", "ask"} <= top  # pyproject.toml read: a reading of none checks none
    for module, imported in imports().items():
        if layer_of(module) not in top:
            for other in imported:
                assert layer_of(other) not in top, f"{module} imports the command module {other}"


def test_leaves_import_only_leaves() -> None:
    """The top-level modules that are no command (errors.py, exits.py, paths.py, rules.py, scores.py, ...) are leaves
    every layer may import: they import no subpackage and no command, only one another."""
    top = commands()
    for module, imported in imports().items():
        if layer_of(module) not in (*SUBPACKAGES, *top, ""):
            for other in imported:
                theirs = layer_of(other)
                assert theirs not in SUBPACKAGES and theirs not in top, f"the leaf {module} imports {other}"


def test_reading_a_report_loads_no_torch_and_no_lightning() -> None:
    code = (
        "import sys, pkgutil, importlib, nplm_repro.reporting as r, nplm_repro.report\n"
        "[importlib.import_module(m.name) for m in pkgutil.iter_modules(r.__path__, r.__name__ + '.')]\n"
        "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
