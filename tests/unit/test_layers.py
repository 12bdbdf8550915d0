"""The packages of app/ in layers (README "Architecture"): each may import its own and lower layers only, app/
imports no test tooling, and no two modules of app/ import each other, even through others.

Read from the source (every import statement, those inside functions and `if TYPE_CHECKING:` included), so the
check needs no Spark and runs in CI with the unit tests.
"""
from __future__ import annotations

import ast
import configparser
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A module sits in the layer of its package (app.wire.registry -> app.wire).
LAYERS: list[set[str]] = [
    {"app", "app.errors", "app.hooks"},
    {"app.config"},
    {"app.spark", "app.wire", "app.recovery"},
    {"app.cdc"},
    {"app.routing", "app.sink"},
    {"app.state"},
    {"app.batch"},
    {"app.job"},
    {"app.main"},
]
TOOLING = ("devkit", "tests", "scripts")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from app import job` imports the module app.job
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if (ROOT / node.module.replace(".", "/") / f"{alias.name}.py").exists())
    return found


def _unit(module: str) -> str:
    """The layered unit a module belongs to: its package under app/, or itself for a top-level module."""
    units = [u for layer in LAYERS for u in layer if module == u or module.startswith(u + ".")]
    if units:
        return max(units, key=len)
    raise AssertionError(f"{module} is in no layer of tests/unit/test_layers.py: add it (and to README)")


def _rank(module: str) -> int:
    unit = _unit(module)
    return next(n for n, layer in enumerate(LAYERS) if unit in layer)


APP = {_module(p): p for p in sorted((ROOT / "app").rglob("*.py"))}
GRAPH = {m: {i for i in _imports(p) if i == "app" or i.startswith("app.")} for m, p in APP.items()}


@pytest.mark.parametrize("module", sorted(APP))
def test_a_module_imports_its_own_and_lower_layers_only(module: str) -> None:
    unit, rank = _unit(module), _rank(module)
    wrong = sorted(
        i for i in GRAPH[module]
        if i != "app" and _unit(i) != unit and (_rank(i) > rank or (_rank(i) == rank and unit != "app"))
    )
    assert not wrong, f"{module} (layer {rank}, {unit}) imports {wrong}: a higher layer or a sibling of its own"


@pytest.mark.parametrize("module", sorted(APP))
def test_the_product_imports_no_test_tooling(module: str) -> None:
    tooling = sorted(i for i in _imports(APP[module]) if i.split(".")[0] in TOOLING)
    assert not tooling, f"{module} imports {tooling}"


def test_no_import_cycle_in_app() -> None:
    edges = {m: {i for i in targets if i in APP and i != m} for m, targets in GRAPH.items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module):], module]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        for target in sorted(edges[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])


# Distribution (setup.cfg) -> the top-level modules it gives app/ (py4j and botocore come with pyspark and boto3).
DISTRIBUTIONS = {
    "pyspark": {"pyspark", "py4j"}, "requests": {"requests"}, "PyYAML": {"yaml"}, "boto3": {"boto3", "botocore"},
}


# Distribution -> modules app/ imports only inside the function that needs them, and only where a config asks: an
# extra of setup.cfg, not shipped; without it the job runs as if not asked (confluent-kafka: the count of the topics'
# records for spark.available_now_java_options_max_records, app/wire/source.py `retained_records`).
OPTIONAL = {"confluent-kafka": {"confluent_kafka"}}


def _names(section: str) -> set[str]:
    return {re.split(r"[=<>\[ ]", line)[0] for line in (line.strip() for line in section.splitlines())
            if line and not line.startswith("#")}


def _imported_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""] if isinstance(node, ast.ImportFrom) else []


def test_the_shipped_requirements_are_what_app_imports() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    shipped = _names(config["options"]["install_requires"])
    stdlib = set(sys.stdlib_module_names)
    third_party = {i.split(".")[0] for p in APP.values() for i in _imports(p)} - stdlib - {"app", "__future__"}
    assert shipped == set(DISTRIBUTIONS), f"install_requires lists {sorted(shipped)}"
    optional = set().union(*OPTIONAL.values())
    assert third_party == set().union(*DISTRIBUTIONS.values()) | optional, f"app/ imports {sorted(third_party)}"
    extras = config["options.extras_require"]
    for distribution in OPTIONAL:  # an extra a deployment can ask for, not only the test tooling's
        assert any(distribution in _names(extras[name]) for name in extras if name not in ("test", "bench")), (
            f"{distribution} in no extra of the job's own")
    at_module_level = {(str(path.relative_to(ROOT)), name) for path in APP.values()
                       for node in ast.parse(path.read_text(encoding="utf-8")).body
                       for name in _imported_names(node) if name.split(".")[0] in optional}
    assert not at_module_level, f"an optional distribution imported at module level: {sorted(at_module_level)}"


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    """The checks above would fail on a wrong import (they read what they are meant to)."""
    assert _rank("app.sink.hudi") > _rank("app.cdc.unwrap")
    assert "app.batch.processor" in GRAPH["app.job"]
    assert "app.state.stats" in GRAPH["app.batch.processor"]
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def f():\n    from app.batch.plan import TablePlan\n    import devkit.pauses\n", encoding="utf-8")
    assert {"app.batch.plan", "devkit.pauses"} <= _imports(wrong)
