"""The house rules of docs/architecture.md, read from the source: no import circle among module-level
imports, no private name taken from another module, imports inside functions only where they defer
something on purpose (and say so), and the folders' direction of flow.

The modules are read as text (``ast``), never imported, so a circle that Python happens to tolerate
today (a partly initialised module that already has the name asked for) is still found."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
#: where each package of the distribution lives in the repository (pyproject's package-dir)
SOURCES = {"attnviz": ROOT / "attnviz", "attnviz.dashboard": ROOT / "apps" / "dashboard"}
#: what a function may import without a comment: optional or heavy dependencies a module defers
DEFERRED_DEPENDENCIES = {
    "IPython",
    "accelerate",
    "bertviz",
    "circuitsvis",
    "dash",
    "datasets",
    "diskcache",
    "gguf",
    "importlib",
    "jieba",
    "kaleido",
    "pandas",
    "plotly",
    "pyarrow",
    "safetensors",
    "scipy",
    "sklearn",
    "torch",
    "tqdm",
    "transformers",
    "umap",
}
#: the folders of attnviz and what each may import at module level (docs/architecture.md, "The flow")
LAYERS = {
    "families": {"families"},
    "engine": {"engine", "families"},
    "data": {"data", "engine"},
    "analysis": {"analysis", "data", "engine"},
    "views": {"views", "analysis", "data", "engine"},
    "workflows": {"workflows", "analysis", "data", "engine", "families"},
    "testing": {"testing", "workflows", "analysis", "data", "engine", "families"},
}


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    imports: list[tuple[str, int]] = field(default_factory=list)  # (module, line) at module level, run time


def modules() -> dict[str, Module]:
    found = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join((package, *parts[:-1]) if is_package else (package, *parts))
            found[name] = Module(name, path, ast.parse(path.read_text(), str(path)), is_package)
    return found


def absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def targets(module: Module, node: ast.Import | ast.ImportFrom, known: dict[str, Module]) -> list[str]:
    """The attnviz modules an import statement runs (``from . import x`` runs ``pkg.x`` when it is one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    base = absolute(module, node)
    out = [base] if base in known else []
    out += [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
    return out


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(module: Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported (not those under ``if TYPE_CHECKING:``)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(node)
            elif isinstance(node, ast.If) and not is_type_checking(node):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                for handler in node.handlers:
                    walk(handler.body)
                walk(node.orelse)
                walk(node.finalbody)

    walk(module.tree.body)
    return found


def graph(known: dict[str, Module]) -> dict[str, set[str]]:
    """Module → the modules its module-level imports run. Importing ``a.b.c`` also runs the package
    ``a.b`` (its ``__init__``), unless that package is one the importer itself lives in (then it is
    already being imported)."""
    edges: dict[str, set[str]] = {name: set() for name in known}
    for module in known.values():
        own = {".".join(module.name.split(".")[:i]) for i in range(1, module.name.count(".") + 2)}
        for node in module_level_imports(module):
            for target in targets(module, node, known):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in known and name not in own:
                        edges[module.name].add(name)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def defined_names(tree: ast.Module) -> set[str]:
    """Every name a module binds anywhere (functions, classes, attributes, assignments, arguments)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)  # dataclass(field=...) and friends
    return names


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_import_circle_among_module_level_imports():
    found = circles(graph(modules()))
    assert found == [], "module-level imports that go round in a circle (defer one, or move what both need):\n" + (
        "\n".join(" → ".join(group) for group in found)
    )


def test_no_private_name_is_imported_from_another_module():
    bad = []
    for module in modules().values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom) and absolute(module, node).startswith("attnviz"):
                bad += [
                    f"{module.path.relative_to(ROOT)}:{node.lineno} {a.name}" for a in node.names if is_private(a.name)
                ]
    for path in sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "bench").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnviz"):
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name}" for a in node.names if is_private(a.name)]
    assert bad == [], "private names imported from another module (make them public API, with a docstring):\n" + (
        "\n".join(bad)
    )


def test_no_private_attribute_of_another_module_is_used():
    """``other._thing`` where ``_thing`` is bound nowhere in this module: a private name of another one."""
    bad = []
    for module in modules().values():
        own = defined_names(module.tree)
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr not in own:
                if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                    continue  # an attribute of the module's own class, set by a parent class it extends
                if node.attr.startswith("_attn_implementation") or node.attr in ALLOWED_FOREIGN_PRIVATE:
                    continue
                bad.append(f"{module.path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert bad == [], "private attributes of other modules (make them public, with a docstring):\n" + "\n".join(bad)


#: private attributes of *other projects'* objects that attnviz reads on purpose, each for a reason
ALLOWED_FOREIGN_PRIVATE = {
    "_getframe",  # sys._getframe: the calling frame of the attention function (engine.interface)
    "_local_mapping",  # transformers' AttentionInterface keeps local overrides there (engine.interface)
    "_hf_hook",  # accelerate's hook on a dispatched model: such a model runs whole (workflows)
    "_forward_hooks",  # torch: whether a module has hooks of its own (the corpus path's early stop)
    "_forward_pre_hooks",
    "_softmax",  # torch.ops.aten._softmax.out: the softmax written into a buffer of the corpus reduction
    "_version",  # torch: a tensor's in-place version counter, so a changed weight's Gram matrices are redone
}


def test_imports_inside_functions_defer_something_and_say_so():
    """An import inside a function is there to defer a heavy or optional dependency (allowed as it
    is), or an attnviz module that must not load with its importer — then a comment says why."""
    bad = []
    for module in modules().values():
        lines = module.path.read_text().splitlines()
        for func in ast.walk(module.tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                name = node.names[0].name if isinstance(node, ast.Import) else absolute(module, node)
                if name.split(".")[0] in DEFERRED_DEPENDENCIES:
                    continue
                said = " ".join(lines[max(0, node.lineno - 3) : node.end_lineno or node.lineno])
                if "#" not in said:
                    bad.append(f"{module.path.relative_to(ROOT)}:{node.lineno} {name}")
    assert bad == [], "imports inside functions with no comment saying what they defer and why:\n" + "\n".join(bad)


def test_the_folders_import_only_in_the_direction_of_the_flow():
    known = modules()
    bad = []
    for module in known.values():
        parts = module.name.split(".")
        if parts[0] != "attnviz" or len(parts) < 3 or parts[1] not in LAYERS:
            continue
        allowed = LAYERS[parts[1]]
        for node in module_level_imports(module):
            for target in targets(module, node, known):
                t = target.split(".")
                if len(t) >= 2 and t[1] in SUBPACKAGES and t[1] not in allowed:
                    bad.append(f"{module.name} imports {target} at module level")
    assert bad == [], "imports against the flow (docs/architecture.md):\n" + "\n".join(bad)


SUBPACKAGES = set(LAYERS) | {"dashboard"}

#: folders that never import what draws, at any level: not at module level, not inside a function, not
#: under TYPE_CHECKING, not through importlib with the name as text (their HTML comes from data.reprs)
NEVER_DRAW = {"data", "analysis"}
DRAWING = ("attnviz.views", "attnviz.figures", "attnviz.dashboard")


def imports_of_the_views(known: dict[str, Module]) -> list[str]:
    """Every import of ``views``/``figures``/the dashboard in ``data/`` and ``analysis/``, wherever it sits."""
    bad = []
    for module in known.values():
        parts = module.name.split(".")
        if parts[0] != "attnviz" or len(parts) < 2 or parts[1] not in NEVER_DRAW:
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = absolute(module, node)
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Call):  # importlib.import_module("attnviz.views…"), __import__(…)
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            else:
                continue
            if any(name == d or name.startswith(d + ".") for name in names for d in DRAWING):
                bad.append(f"{module.name}:{node.lineno}")
    return sorted(set(bad))


def test_data_and_analysis_never_import_the_views_at_any_level():
    bad = imports_of_the_views(modules())
    assert bad == [], (
        "data/ and analysis/ import the views (register a drawing in data.reprs from the view instead):\n"
        + "\n".join(bad)
    )


def test_the_views_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    pkg = tmp_path / "attnviz"
    for folder in ("data", "analysis", "views"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "views" / "html.py").write_text("def draw(x):\n    return ''\n")
    (pkg / "data" / "a.py").write_text("def f():\n    from ..views.html import draw  # deferred\n    return draw\n")
    (pkg / "analysis" / "b.py").write_text(
        "import importlib\n\ndef g():\n    importlib.import_module('attnviz.figures')\n"
    )
    (pkg / "analysis" / "c.py").write_text("from ..data import a\n")
    monkeypatch.setitem(SOURCES, "attnviz", pkg)
    monkeypatch.delitem(SOURCES, "attnviz.dashboard")
    found = imports_of_the_views(modules())
    assert found == ["attnviz.analysis.b:4", "attnviz.data.a:2"]


def names_a_model_type(node: ast.expr) -> bool:
    """Whether an expression is a config's model type: ``….model_type``, a name ``model_type``, or
    ``getattr(…, "model_type", …)``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "model_type"
    if isinstance(node, ast.Name):
        return node.id == "model_type"
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value == "model_type"
    )


def is_literal(node: ast.expr) -> bool:
    """A string written in the code, or a collection written out of them (a tuple, list, set, or
    ``frozenset({…})`` / ``set(…)`` / ``tuple(…)`` of one)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(is_literal(e) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"frozenset", "set", "tuple"}:
        return any(is_literal(a) for a in node.args)
    return False


def family_tests(tree: ast.Module) -> list[int]:
    """Lines comparing a model type with a literal (``==``, ``!=``, ``in``, ``not in``, either side):
    a family named in code. Looking a model type up in a table (``PROJECTION_SPECS.get(model_type)``,
    ``model_type in auto.MODEL_MAPPING_NAMES``) or looping over transformers' mapping names is not one."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for (a, b), op in zip(zip(sides, sides[1:], strict=False), node.ops, strict=True):
            if not isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn):
                continue
            if (names_a_model_type(a) and is_literal(b)) or (names_a_model_type(b) and is_literal(a)):
                found.append(node.lineno)
    return found


def test_no_family_is_named_by_its_model_type_outside_the_families():
    """A family's facts live in its module under ``attnviz/families/`` (docs/architecture.md, "Where a new
    thing goes"): nowhere else in attnviz or the dashboard is a model type compared with a literal."""
    families = SOURCES["attnviz"] / "families"
    bad = [
        f"{module.path.relative_to(ROOT)}:{line}"
        for module in modules().values()
        if families not in module.path.parents
        for line in family_tests(module.tree)
    ]
    assert bad == [], "a model type compared with a literal outside attnviz/families/ (make it a family's fact):\n" + (
        "\n".join(bad)
    )


@pytest.mark.parametrize(
    ("code", "found"),
    [
        ('if config.model_type == "idefics3": pass', [1]),
        ('x = getattr(config, "model_type", "") != "idefics3"', [1]),
        ('ok = model_type in {"bert", "roberta"}', [1]),
        ('ok = "t5" in (model_type,) or model_type not in ("t5",)', [1]),
        ("ok = PROJECTION_SPECS.get(model_type)", []),
        ("for model_type in auto.MODEL_MAPPING_NAMES:\n    ok = model_type in auto.MODEL_MAPPING_NAMES", []),
        ('ok = config.model_type == other.model_type and name == "bert"', []),
    ],
)
def test_the_family_rule_reads_comparisons_with_literals(code, found):
    assert family_tests(ast.parse(code)) == found


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_circle_finder_finds_circles(edges, expected):
    assert circles(edges) == expected


def test_the_walk_reads_real_imports_and_sees_a_planted_circle(tmp_path, monkeypatch):
    """The walk on a tiny package with a circle through a relative import and a TYPE_CHECKING one."""
    pkg = tmp_path / "attnviz"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text("")
    (pkg / "data" / "a.py").write_text("from .b import B\n")
    (pkg / "data" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n")
    (pkg / "data" / "c.py").write_text("from . import a\nfrom ..data.b import B\n")
    monkeypatch.setitem(SOURCES, "attnviz", pkg)
    monkeypatch.delitem(SOURCES, "attnviz.dashboard")
    assert circles(graph(modules())) == []  # b → c only under TYPE_CHECKING
    (pkg / "data" / "b.py").write_text("from .c import C\n")
    assert circles(graph(modules())) == [["attnviz.data.a", "attnviz.data.b", "attnviz.data.c"]]


#: the library's public modules: all the dashboard and the CLI may import of attnviz, each offering the
#: names of its ``__all__`` (docs/architecture.md, "The dashboard")
PUBLIC_MODULES = (
    "attnviz",
    "attnviz.analysis",
    "attnviz.assets",
    "attnviz.edits",
    "attnviz.families",
    "attnviz.figures",
    "attnviz.figures.helpers",
    "attnviz.files",
    "attnviz.models",
    "attnviz.processes",
)
#: the packages held to the public names, each → the modules it may import freely besides its own: the CLI
#: its errors (the whole of attnviz.errors is public) and the dashboard it starts (``attnviz app``)
ON_PUBLIC_NAMES = {
    "attnviz.dashboard": (),
    "attnviz.cli": ("attnviz.errors", "attnviz.dashboard"),
}


def public_names(known: dict[str, Module]) -> dict[str, set[str]]:
    """Each public module → the names its ``__all__`` lists (read from the source), and its public submodules."""
    names: dict[str, set[str]] = {}
    for name in PUBLIC_MODULES:
        listed: set[str] = set()
        for node in known[name].tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                listed |= set(ast.literal_eval(node.value))
        names[name] = listed | {sub.removeprefix(name + ".") for sub in PUBLIC_MODULES if sub.startswith(name + ".")}
    return names


def non_public_reaches(module: Module, own: str, known: dict[str, Module], free: tuple[str, ...] = ()) -> list[str]:
    """Where ``module`` reaches into attnviz past its public names: an import of a module that is not public
    (``attnviz.workflows.models``, ``attnviz.analysis.stats``), a name a public module's ``__all__`` does not
    list (``from attnviz.analysis import _x``), or such an attribute of a public module (``attnviz.views``,
    ``figures.something_private``) — at module level or inside functions. ``own``'s modules are its own, and
    those of ``free`` (with their submodules) it may import as it likes; a dunder (``__version__``) is no reach."""
    public = public_names(known)
    bound: dict[str, str] = {}  # a local name → the public module it is
    bad = []

    def library(name: str) -> bool:
        return (name == "attnviz" or name.startswith("attnviz.")) and not any(
            name == mine or name.startswith(mine + ".") for mine in (own, *free)
        )

    where = module.name
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not library(alias.name):
                    continue
                if alias.name not in PUBLIC_MODULES:
                    bad.append(f"{where}:{node.lineno} import {alias.name}")
                elif alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = "attnviz"
        elif isinstance(node, ast.ImportFrom):
            base = absolute(module, node)
            if not library(base):
                continue
            if base not in PUBLIC_MODULES:
                bad.append(f"{where}:{node.lineno} from {base} import {', '.join(a.name for a in node.names)}")
                continue
            for alias in node.names:
                if alias.name.startswith("__") and alias.name.endswith("__"):
                    continue  # the package's own facts (``from attnviz import __version__``)
                if alias.name not in public[base]:
                    bad.append(f"{where}:{node.lineno} from {base} import {alias.name} (not in its __all__)")
                elif f"{base}.{alias.name}" in PUBLIC_MODULES:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"

    def resolved(node: ast.expr) -> str | None:  # the public module an expression names, if any
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            parent = resolved(node.value)
            if parent is not None and f"{parent}.{node.attr}" in PUBLIC_MODULES:
                return f"{parent}.{node.attr}"
        return None

    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and not node.attr.startswith("__"):
            parent = resolved(node.value)
            if parent is not None and node.attr not in public[parent]:
                bad.append(f"{where}:{node.lineno} {parent}.{node.attr} (not in its __all__)")
    return bad


@pytest.mark.parametrize("own", ON_PUBLIC_NAMES)
def test_the_dashboard_and_the_cli_use_the_library_s_public_names_only(own):
    known = modules()
    assert any(name == own for name in known), f"no package {own}: ON_PUBLIC_NAMES names what is checked"
    bad = [
        reach
        for name, module in sorted(known.items())
        if name == own or name.startswith(own + ".")
        for reach in non_public_reaches(module, own, known, ON_PUBLIC_NAMES[own])
    ]
    assert bad == [], (
        f"{own} reaches past the library's public names ({', '.join(PUBLIC_MODULES)}): give what it needs a "
        "public name (attnviz.models, an __all__ entry) and use that:\n" + "\n".join(bad)
    )


def test_the_public_names_check_sees_a_planted_reach(tmp_path, monkeypatch):
    """A dashboard module that imports a workflow, a private name or a non-public attribute is refused."""
    app = tmp_path / "dashboard"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "ok_view.py").write_text(
        "import attnviz\nfrom attnviz import figures\nfrom attnviz.models import describe_model\nfrom . import ok_view\n"
        "attnviz.capture\nattnviz.analysis.rollout\nfigures.heatmap\n"
    )
    monkeypatch.setitem(SOURCES, "attnviz.dashboard", app)
    known = modules()
    assert non_public_reaches(known["attnviz.dashboard.ok_view"], "attnviz.dashboard", known) == []
    (app / "bad_view.py").write_text(
        "import attnviz\nimport attnviz.workflows.pipeline\nfrom attnviz import figures as f\n"
        "from attnviz.analysis.stats import STATISTICS\nfrom attnviz.analysis import _private\n"
        "def late():\n    from attnviz.workflows.models import describe_model  # deferred\n"
        "attnviz.workflows.runner\nattnviz.analysis.stats\nf.views\n"
    )
    known = modules()
    found = non_public_reaches(known["attnviz.dashboard.bad_view"], "attnviz.dashboard", known)
    assert sorted(reach.split(" ", 1)[1] for reach in found) == sorted(
        [
            "import attnviz.workflows.pipeline",
            "from attnviz.analysis.stats import STATISTICS",
            "from attnviz.analysis import _private (not in its __all__)",
            "from attnviz.workflows.models import describe_model",
            "attnviz.workflows (not in its __all__)",
            "attnviz.analysis.stats (not in its __all__)",
            "attnviz.figures.views (not in its __all__)",
        ]
    )


def unnamed_modules(doc: str, roots: list[Path]) -> list[str]:
    """The modules under ``roots`` that ``doc`` does not name by their file's stem (``__init__``, ``__main__``
    and the dashboard's ``<view>_view.py``, named by the rule "one module per view", aside)."""
    missing = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.stem in ("__init__", "__main__") or (root.name == "dashboard" and path.stem.endswith("_view")):
                continue
            if not re.search(rf"(?<![\w]){re.escape(path.stem)}(?![\w])", doc):
                missing.append(str(path.relative_to(ROOT)))
    return missing


def test_the_architecture_page_names_every_module():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = unnamed_modules(doc, [ROOT / "attnviz", ROOT / "apps" / "dashboard"])
    assert missing == [], "docs/architecture.md does not name these modules (say what each holds):\n" + "\n".join(
        missing
    )
    assert unnamed_modules(doc.replace("`transfer.py`", "").replace("transfer", ""), [ROOT / "attnviz"]) == [
        "attnviz/engine/transfer.py"
    ]  # the check sees a module the page stops naming


def test_the_public_names_check_sees_a_planted_reach_in_the_cli(tmp_path):
    """A CLI module may import its own modules, attnviz.errors, the dashboard it starts and the public names
    (deferred or not); one that reaches a workflow, an analysis module or a view, even inside a function, is
    refused."""
    known = modules()

    def cli_module(name: str, source: str) -> Module:
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        return Module(f"attnviz.cli.{name}", path, ast.parse(source, str(path)), False)

    ok = cli_module(
        "ok_command",
        "from ..errors import InputError\nfrom .options import names\n"
        "def run():\n    from .. import __version__, capture, load\n    from ..models import check_keep\n"
        "    from ..processes import process_rank\n    from attnviz.dashboard import run\n",
    )
    assert non_public_reaches(ok, "attnviz.cli", known, ON_PUBLIC_NAMES["attnviz.cli"]) == []
    bad = cli_module(
        "bad_command",
        "from ..errors import InputError\n"
        "def run():\n    from ..workflows.corpus.processes import process_rank  # deferred\n"
        "    from ..analysis.layer_reduction import wanted_columns\n    from ..views.atlas import atlas_page\n"
        "    from ..models import _private\n",
    )
    found = non_public_reaches(bad, "attnviz.cli", known, ON_PUBLIC_NAMES["attnviz.cli"])
    assert sorted(reach.split(" ", 1)[1] for reach in found) == sorted(
        [
            "from attnviz.workflows.corpus.processes import process_rank",
            "from attnviz.analysis.layer_reduction import wanted_columns",
            "from attnviz.views.atlas import atlas_page",
            "from attnviz.models import _private (not in its __all__)",
        ]
    )


def test_no_symlink_inside_the_packages():
    """A link inside a package (a worktree's ``attnviz/dashboard -> ../apps/dashboard`` once committed as
    ``apps/dashboard/dashboard``) makes the package contain itself: the wheel and the module walk loop on it."""
    links = [str(p.relative_to(ROOT)) for src in SOURCES.values() for p in src.rglob("*") if p.is_symlink()]
    assert links == [], f"remove these links from the packages: {links}"
