"""The operator's modules sit on floors, and imports only go down (docs/architecture.md, "Code layout"). As
import-linter's contracts declare it (kopf's .importlinter): every floor names what it may import, and every module of
the package sits on a declared floor, so a new module must be placed before it can import anything.

  api                          the vocabulary: models, names, times, conditions, backoff policies, wire helpers
                               (imports nothing of ours)
  render, promotion, plan      pure: spec + observations + now -> desired objects, status, requeue (import only api and
                               each other: plan uses render and promotion; render and promotion use neither)
  metrics, settings            the operator's Prometheus collectors; its settings from the environment
  state_metrics                the per-DecisionModel state series, from the watch cache at scrape time
  kube, clients                the wire: Kubernetes machinery (kube: transport, client, kinds, watch, cache, work
                               queue, namespace label watches, leader, shard) and the S3, registry, Prometheus
                               clients; neither uses the other
  observe, sync                reads (observe) and the one write outside the cluster (sync)
  apply, registry_handlers     the writes of a reconcile: children and status; the registry's finalizer
  refuse                       the status of an object the operator cannot decode or validate
  admission                    the validating webhook: the same checks as the plan, at `oc apply`
  metrics_server               the operator's /metrics: HTTPS, each scrape's token judged by kube/authn
  reconcile                    one pass: observe, sync, plan, apply
  triggers                     watch events -> work-queue keys (never a reconcile of their own)
  app                          the composition root: builds all of the above for one run
  handlers, __main__, cli      entry points: kopf glue, the command line, the kubectl plugin (which reads the
                               pure floors: lint judges by the plan's checks, diagnose and the dashboard by its PromQL)

A pure module importing a reader or a writer would bring I/O into the planner; a cycle would mean no floor order.
Parsed with `ast` (no import runs), so a violation shows the exact module pair.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import arbiter_operator

PACKAGE = Path(arbiter_operator.__file__).parent
ROOT = "arbiter_operator"
# Test servers and builds are not part of the data path.
SKIP = ("devenv",)

PURE = ("api", "render", "promotion", "plan")
_DOMAIN = {"api", "render", "promotion", "plan", "metrics", "settings", "kube", "clients", "observe", "sync"}
# Each floor and what it may import (its own floor included where it has modules of its own).
ALLOWED = {
    "api": {"api"},
    "render": {"api", "render"},
    "promotion": {"api", "promotion"},
    "plan": {"api", "plan", "render", "promotion"},
    "metrics": set(),
    "settings": {"api"},
    "state_metrics": {"api"},
    "kube": {"api", "kube", "metrics"},
    "clients": {"api", "clients", "metrics"},
    "observe": {"api", "render", "promotion", "plan", "metrics", "kube", "clients", "observe"},
    "sync": {"api", "render", "promotion", "plan", "metrics", "kube", "clients", "observe", "sync"},
    "apply": _DOMAIN,
    "registry_handlers": _DOMAIN,
    "refuse": _DOMAIN | {"apply"},
    "admission": {"api", "plan", "refuse"},
    "metrics_server": {"metrics", "kube"},
    "reconcile": _DOMAIN | {"apply", "registry_handlers", "refuse"},
    "triggers": {"api", "render", "promotion", "plan", "metrics", "kube"},
    "app": _DOMAIN | {"apply", "registry_handlers", "reconcile", "triggers", "state_metrics"},
    "handlers": _DOMAIN | {"apply", "registry_handlers", "reconcile", "triggers", "app", "admission"},
    "__main__": _DOMAIN | {"apply", "registry_handlers", "reconcile", "triggers", "app", "handlers", "admission",
                           "metrics_server"},
    "cli": {"api", "plan", "promotion", "cli"},
}
IO = ("clients", "observe", "sync")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in SKIP:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([ROOT, *parts])] = path
    return out


def _imports(name: str, path: Path, known: set[str], top_level_only: bool = False) -> set[str]:
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in (tree.body if top_level_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import submodule` imports the submodule; `from mod import name` the module.
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith(ROOT + "."):
                found.add(t)
    return found


def _graph(top_level_only: bool = False) -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known, top_level_only) for name, path in mods.items()}


def _floor(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def test_every_module_sits_on_a_declared_floor():
    unplaced = sorted(m for m in _graph() if m != ROOT and _floor(m) not in ALLOWED)
    assert unplaced == [], "place these modules on a floor (ALLOWED, docs/architecture.md): " + ", ".join(unplaced)


def test_every_floor_imports_only_what_it_may():
    wrong = sorted(
        f"{m} imports {t}"
        for m, targets in _graph().items()
        if _floor(m) in ALLOWED
        for t in targets
        if _floor(t) not in ALLOWED[_floor(m)]
    )
    assert wrong == [], "\n".join(wrong)


def test_no_reader_or_writer_is_imported_by_a_pure_module():
    wrong = sorted(
        f"{m} imports {t}"
        for m, targets in _graph().items()
        if _floor(m) in PURE
        for t in targets
        if _floor(t) in IO
    )
    assert wrong == [], "\n".join(wrong)


def test_clients_import_only_the_vocabulary():
    wrong = sorted(
        f"{m} imports {t}"
        for m, targets in _graph().items()
        if _floor(m) == "clients"
        for t in targets
        if _floor(t) not in ("api", "clients", "metrics")
    )
    assert wrong == [], "\n".join(wrong)


def test_the_import_graph_has_no_cycle():
    # Module-level imports: a deferred import inside a function (the kubectl plugin's completion, which needs the
    # parser it completes) runs after both modules are loaded and cannot deadlock an import.
    graph = _graph(top_level_only=True)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert cycles == [], "\n".join(cycles)


def test_the_check_sees_the_modules_it_judges():
    # Guards the guard: a path or parsing slip would make every test above pass on an empty graph.
    graph = _graph()
    assert "arbiter_operator.api.models" in graph["arbiter_operator.render.configmap"]
    assert "arbiter_operator.plan.artifacts" in graph["arbiter_operator.observe.storage"]
    reconcile = graph["arbiter_operator.reconcile"]
    assert {"arbiter_operator.observe.children", "arbiter_operator.sync.registry"} <= reconcile
    assert "arbiter_operator.kube.kinds" in graph["arbiter_operator.kube.client"]
    assert "arbiter_operator.triggers" in graph["arbiter_operator.app"]
    assert "arbiter_operator.app" in graph["arbiter_operator.handlers"]


def test_the_operator_takes_only_the_decision_json_contract_from_the_runtime():
    # decision.json is one model on both sides (arbiter_runtime.contract); the rest of the runtime (HTTP server,
    # vLLM client, its dependencies) must stay out of the operator, and the contract must need nothing but pydantic.
    import arbiter_runtime

    taken = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) and node.level == 0 else ""
            if module.startswith("arbiter_runtime"):
                taken.add(f"{path.relative_to(PACKAGE)}: {module}")
            elif isinstance(node, ast.Import):
                taken |= {f"{path.relative_to(PACKAGE)}: {a.name}" for a in node.names
                          if a.name.startswith("arbiter_runtime")}
    assert taken and all(t.endswith(": arbiter_runtime.contract") for t in taken), sorted(taken)
    contract = Path(arbiter_runtime.__file__).parent / "contract.py"
    imported = set()
    for node in ast.walk(ast.parse(contract.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
    assert imported - set(sys.stdlib_module_names) <= {"pydantic", "pydantic_core"}, sorted(imported)
