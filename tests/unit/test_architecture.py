"""The layout holds: imports run one way (front doors → use cases →
repository → PostgreSQL; pure decisions import nothing of the rest), no
module grows past the size a reader takes in at once, and the state machine
drawn in docs/architecture.md is the code's table."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app.domain.states import TRANSITIONS, Status

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500

# Package → the packages of this repository it must never import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "app": ("workers", "tests", "bench"),
    "app.domain": (
        "app.db",
        "app.usecases",
        "app.infra",
        "app.providers",
        "app.api",
        "app.console",
        "app.smtp",
        "app.cli",
        "app.observability",
    ),
    "app.db": ("app.usecases", "app.api", "app.console", "app.smtp", "app.cli", "app.providers"),
    "app.providers": ("app.usecases", "app.api", "app.console", "app.smtp", "app.cli"),
    "app.infra": ("app.usecases", "app.api", "app.console", "app.smtp", "app.cli"),
    "app.usecases": ("app.api", "app.console", "app.smtp", "app.cli"),
    # Front doors go through a use case, never to the repository.
    "app.api": ("app.db",),
    "app.console": ("app.db",),
    "app.smtp": ("app.db",),
    "workers": ("app.db", "app.api", "app.console", "app.smtp", "app.cli"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts)


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_imports_run_one_way() -> None:
    wrong = []
    for path in _sources("app", "workers"):
        module = _module_name(path)
        for package, forbidden in FORBIDDEN.items():
            if not _within(module, package):
                continue
            wrong += [
                f"{module} imports {name}"
                for name in sorted(_imports(path))
                if any(_within(name, f) for f in forbidden)
            ]
    assert wrong == []


def test_no_source_file_is_over_the_size_a_reader_takes_in() -> None:
    paths = _sources("app", "workers", "clients")
    assert len(paths) > 50
    long = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in paths
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert long == []


def _drawn_transitions() -> set[tuple[str, str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("<!-- transitions -->")[1].split("<!-- /transitions -->")[0]
    rows = re.findall(r"^\|\s*`(\w+)`\s*\|\s*`(\w+)`\s*\|", section, re.MULTILINE)
    return set(rows)


def test_the_documented_state_table_is_the_codes() -> None:
    drawn = _drawn_transitions()
    assert drawn == {(src.value, dst.value) for src, dst in TRANSITIONS}


@pytest.mark.parametrize("status", list(Status))
def test_every_status_is_documented(status: Status) -> None:
    assert f"`{status.value}`" in (ROOT / "docs" / "architecture.md").read_text()


def test_the_readmes_layout_table_names_every_package_and_only_real_ones() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("| path | what |")[1].split("\n\n")[0]
    first_cells = [row.split("|")[1] for row in table.splitlines() if row.startswith("| `")]
    named = {n for cell in first_cells for n in re.findall(r"`([a-z_]+/(?:[a-z_]+/)?)`", cell)}
    packages = {f"app/{p.name}/" for p in (ROOT / "app").iterdir() if (p / "__init__.py").exists()}
    assert packages <= named
    assert [n for n in named if not (ROOT / n).is_dir()] == []


# ------------------------------------------------ straight edges (issue 49)

# Package → what it must never import (function-level imports count too).
EDGES: dict[str, tuple[str, ...]] = {
    # The API and the console are mounted side by side by app.server; what
    # both use lives in app.web, which knows neither.
    "app.api": ("app.console", "app.server"),
    "app.console": ("app.api", "app.server"),
    "app.web": ("app.api", "app.console", "app.server", "app.db"),
    # /metrics and /readyz read through use cases.
    "app.observability": ("app.db", "app.providers"),
    # Migrations too: the CLI is a front door.
    "app.cli": ("app.db",),
}
# Modules that arm timers, touch the collector, threads, processes, files or
# the network: never in the pure layer (the parse budget is app.infra's).
DOMAIN_FORBIDDEN_MODULES = (
    "asyncio", "concurrent", "gc", "logging", "multiprocessing", "os", "pathlib", "select",
    "selectors", "shutil", "signal", "socket", "subprocess", "sys", "tempfile", "threading",
    "time", "urllib.request", "http", "sqlalchemy", "psycopg", "redis", "kombu", "celery",
    "httpx", "fastapi", "starlette", "aiosmtpd",
)  # fmt: skip


def test_the_front_doors_and_the_observers_keep_their_edges() -> None:
    wrong = [
        f"{_module_name(path)} imports {name}"
        for path in _sources("app")
        for package, forbidden in EDGES.items()
        if _within(_module_name(path), package)
        for name in sorted(_imports(path))
        if any(_within(name, f) for f in forbidden)
    ]
    assert wrong == []


def test_the_domain_imports_no_timer_thread_process_or_io_module() -> None:
    wrong = [
        f"{_module_name(path)} imports {name}"
        for path in _sources("app/domain")
        for name in sorted(_imports(path))
        if any(_within(name, m) for m in DOMAIN_FORBIDDEN_MODULES)
    ]
    assert wrong == []


def _import_graph() -> dict[str, set[str]]:
    """app's modules → the app modules each imports, function-level imports
    included. Importing `a.b.c` from outside the package `a.b` runs
    `a/b/__init__.py` first: an edge to `a.b` too."""
    modules = {_module_name(p): p for p in _sources("app")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        for name in _imports(path):
            target = resolve(name)
            if target is None or target == module:
                continue
            edges.add(target)
            parts = target.split(".")
            for i in range(2, len(parts)):
                parent = ".".join(parts[:i])
                if parent in modules and not _within(module, parent):
                    edges.add(parent)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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


def test_no_import_cycle_among_apps_modules_hidden_or_not() -> None:
    """A function-level import hides a cycle from Python, not from here."""
    graph = _import_graph()
    assert len(graph) > 100
    assert _cycles(graph) == []


def test_one_check_runner_runs_every_check_and_no_front_door_sets_a_module_global() -> None:
    """Issue 49: only the check runner (app/usecases/checks/runner.py) takes a
    check's batch, asks the provider, writes the answer and makes the
    one-statement first look; no module assigns another module's attribute;
    and the check's code and its front doors hold no `global` a caller could
    rebind (the one allowed: the parse cache's own byte count)."""
    root = Path(__file__).resolve().parents[2]
    runner = "app/usecases/checks/runner.py"
    steps = {"signal_lock_for_check", "ask_in_bulkhead", "write_answer", "first_look_if_empty"}
    no_globals = (
        "app/usecases/checks/",
        "app/usecases/signals.py",
        "app/usecases/sweep.py",
        "app/usecases/intake.py",
        "app/usecases/matches.py",
        "app/smtp/",
        "app/api/",
        "workers/",
    )
    allowed_globals = {"_parsed_bytes"}
    callers, rebinds, assigns = [], [], []
    for path in sorted([*(root / "app").rglob("*.py"), *(root / "workers").rglob("*.py")]):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text())
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                base = root / node.module.replace(".", "/")
                modules |= {
                    a.asname or a.name
                    for a in node.names
                    if (base / f"{a.name}.py").exists() or (base / a.name).is_dir()
                }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and rel != runner:
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in steps:
                    callers.append(f"{rel}:{node.lineno} {name}")
            elif isinstance(node, ast.Global) and rel.startswith(no_globals):
                rebinds += [
                    f"{rel}:{node.lineno} {n}" for n in node.names if n not in allowed_globals
                ]
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assigns += [
                    f"{rel}:{node.lineno}"
                    for t in targets
                    if isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id in modules
                ]
    assert callers == []
    assert rebinds == []
    assert assigns == []


# Use cases say what happened; the front doors say it in HTTP (issue 49). An
# outbound request (the dead-letter webhook's POST) is infrastructure:
# `app/infra/webhook_post.py` makes it and answers the receiver's code.
_HTTP_LIBRARIES = ("fastapi", "starlette", "httpx")


def _names_status_code(tree: ast.AST) -> list[int]:
    """The lines where `status_code` is an identifier: a name, an attribute,
    an argument, a keyword or a function (not a string, such as a log field)."""
    lines = []
    for node in ast.walk(tree):
        named = (
            (isinstance(node, ast.Name) and node.id == "status_code")
            or (isinstance(node, ast.Attribute) and node.attr == "status_code")
            or (isinstance(node, ast.arg) and node.arg == "status_code")
            or (isinstance(node, ast.keyword) and node.arg == "status_code")
            or (isinstance(node, ast.FunctionDef) and node.name == "status_code")
        )
        if named:
            lines.append(getattr(node, "lineno", 0))
    return lines


def test_use_cases_return_outcomes_and_know_nothing_of_http() -> None:
    wrong = []
    for path in _sources("app/usecases"):
        relative = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(), filename=relative)
        wrong += [
            f"{relative} imports {name}"
            for name in sorted(_imports(path))
            if any(_within(name, web) for web in _HTTP_LIBRARIES)
        ]
        wrong += [f"{relative}:{line} names status_code" for line in _names_status_code(tree)]
    assert wrong == []


# The one seam to the database (issue 49): statements run through app/db/runner.py.
_RUNNER = "app.db.runner"
# SQLAlchemy's `text` may appear only where the schema is declared for the
# models and Alembic (a server default, a partial index's WHERE), never to run SQL.
_SCHEMA_TEXT = {"app.db.model_base"}


def test_only_the_runner_runs_sql() -> None:
    """No module of app/ but the runner imports `sqlalchemy.text`, calls
    `.execute(` in a module that uses SQLAlchemy, or touches the DBAPI
    connection (`driver_connection`)."""
    wrong: list[str] = []
    for path in _sources("app"):
        name = _module_name(path)
        if name == _RUNNER:
            continue
        imports = _imports(path)
        if "sqlalchemy.text" in imports and name not in _SCHEMA_TEXT:
            wrong.append(f"{name}: imports sqlalchemy.text")
        tree = ast.parse(path.read_text(), filename=str(path))
        uses_sqlalchemy = any(_within(i, "sqlalchemy") for i in imports)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "driver_connection":
                wrong.append(f"{name}:{node.lineno}: driver_connection")
            if (
                uses_sqlalchemy
                and isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "execute"
            ):
                wrong.append(f"{name}:{node.lineno}: .execute(")
    assert wrong == []
