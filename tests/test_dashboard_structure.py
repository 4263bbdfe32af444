"""The dashboard's structure, read without a browser: views do not import each other (a view that adds
a panel to another registers it in ``panels.py``), every registered panel has its host's slot, and the
page places each panel in its host whatever the order the views registered in."""

import ast
from pathlib import Path

import pytest
from attnviz.dashboard import panels
from attnviz.dashboard.ids import AID, EID, GID, ID, view_id
from attnviz.dashboard.layout import build_layout
from dash import html

DASHBOARD = Path(__file__).resolve().parents[1] / "apps" / "dashboard"
VIEW_FILES = sorted(DASHBOARD.glob("*_view.py"))


def imported_modules(tree: ast.Module) -> set[str]:
    """The dashboard modules a module imports, by their short name (``from .x import``, ``from . import x``,
    ``attnviz.dashboard.x``), at module level or inside functions."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level and not module:  # from . import x, y
                names.update(alias.name for alias in node.names)
            elif node.level:  # from .x import y
                names.add(module.split(".")[0])
            elif module == "attnviz.dashboard":
                names.update(alias.name for alias in node.names)
            elif module.startswith("attnviz.dashboard."):
                names.add(module.split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attnviz.dashboard."):
                    names.add(alias.name.split(".")[2])
    return names


def view_imports(path: Path) -> set[str]:
    """The other ``*_view`` modules the view at ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {name for name in imported_modules(tree) if name.endswith("_view") and name != path.stem}


def slot_calls(function: str) -> set[tuple[str, str, str]]:
    """Every ``function("host", "slot")`` call in the dashboard's modules, as (host, slot, file stem)."""
    found = set()
    for path in DASHBOARD.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == function:
                host, slot = (ast.literal_eval(arg) for arg in node.args)
                found.add((host, slot, path.stem))
    return found


def test_the_views_are_found():
    assert {"lab_view", "coref_view", "edit_view", "generation_view", "run_view"} <= {p.stem for p in VIEW_FILES}


@pytest.mark.parametrize("path", VIEW_FILES, ids=lambda p: p.stem)
def test_a_view_imports_no_other_view(path):
    assert view_imports(path) == set(), (
        f"{path.name} imports {sorted(view_imports(path))}: register a panel for another view's slot "
        "(panels.adds_panel) and move shared helpers to a module that is not a view"
    )


def test_every_panel_sits_in_a_slot_its_host_places():
    added = {(host, slot) for host, slot, _ in slot_calls("adds_panel")}
    placed = {(host, slot) for host, slot, _ in slot_calls("slot_panels")}
    assert added == placed and added, (added, placed)
    from attnviz.dashboard import registry

    # a view's module, by its id: the Heatmap tab ("heatmap") is overview_view's
    module = {v.id: v.register.__module__.rsplit(".", 1)[1] for v in registry.views()}
    assert all(stem == module[host] for host, _, stem in slot_calls("slot_panels"))  # a host asks for its own
    guests = {(host, stem) for host, _, stem in slot_calls("adds_panel")}
    assert all(stem != module[host] for host, stem in guests)  # a guest's panel sits in another view


def test_every_panel_is_registered_before_the_page_is_built():
    # layout.py imports every view, so the registry holds each panel the views' sources declare
    assert {(host, slot) for host, slot, _ in panels.registered()} == {
        (host, slot) for host, slot, _ in slot_calls("adds_panel")
    }


def test_a_slot_orders_its_panels_by_name_not_by_registration(monkeypatch):
    monkeypatch.setattr(panels, "_PANELS", {})

    def first() -> html.Div:
        return html.Div(id="first")

    def second() -> html.Div:
        return html.Div(id="second")

    panels.adds_panel("one", "slot")(second)
    panels.adds_panel("one", "slot")(first)
    panels.adds_panel("two", "slot")(first)
    panels.adds_panel("two", "slot")(second)
    panels.adds_panel("two", "slot")(second)  # registering again replaces, never doubles
    assert [p.id for p in panels.slot_panels("one", "slot")] == ["first", "second"]
    assert [p.id for p in panels.slot_panels("two", "slot")] == ["first", "second"]
    assert panels.slot_panels("three", "slot") == []


def ids_in(component) -> set[str]:
    """Every string id in a component tree."""
    found = set()
    stack = [component]
    while stack:
        node = stack.pop()
        if isinstance(node, (list, tuple)):
            stack.extend(node)
            continue
        if getattr(node, "id", None) is not None and isinstance(node.id, str):
            found.add(node.id)
        children = getattr(node, "children", None)
        if children is not None and not isinstance(children, str):
            stack.append(children)
    return found


def nodes_in(component):
    """Every component of a tree, depth first."""
    stack = [component]
    while stack:
        node = stack.pop()
        if isinstance(node, (list, tuple)):
            stack.extend(node)
            continue
        if hasattr(node, "_type"):
            yield node
        children = getattr(node, "children", None)
        if children is not None and not isinstance(children, str):
            stack.append(children)


def test_the_page_places_each_panel_in_its_host():
    page = build_layout([{"label": "m", "value": "m"}], "m", "The cat sat.")
    views = {n.id: n for n in nodes_in(page) if getattr(n, "id", None) in {view_id("lab"), view_id("coref")}}
    lab, coref = ids_in(views[view_id("lab")]), ids_in(views[view_id("coref")])
    assert {GID.step_box, EID.lab_apply, ID.lab_graph} <= lab and EID.coref_candidate not in lab
    assert {EID.coref_candidate, AID.coref_bars} <= coref and EID.lab_apply not in coref
    side = next(n for n in nodes_in(page) if "av-side" in (getattr(n, "className", None) or ""))
    assert {GID.generate, GID.new_tokens, ID.run, ID.model, ID.text} <= ids_in(side)  # the side panel


def test_the_shared_controls_each_have_a_label_that_says_what_they_do():
    """Each shared control sits in a labelled field whose tooltip explains it; the view bar (layer, head,
    units, measure, exports) sits beside the views, not in the side panel."""
    page = build_layout([{"label": "m", "value": "m"}], "m", "The cat sat.")
    fields = [n for n in nodes_in(page) if getattr(n, "className", None) == "av-field"]
    explained = {}
    for f in fields:
        tooltip = f.children[0]
        assert type(tooltip).__name__ == "Tooltip" and len(tooltip.label) > 20, tooltip
        explained.update(dict.fromkeys(ids_in(f.children[1:]), (tooltip.children.children, tooltip.label)))
    shared = [ID.model, ID.example, ID.text, ID.target, ID.layer, ID.head, ID.words, ID.measure, ID.part]
    shared += [ID.export_format, ID.figure_button, ID.csv_button, ID.capture_button, ID.html_button]
    shared += [GID.new_tokens, GID.generate]
    assert [i for i in shared if i not in explained] == []
    assert explained[ID.layer][0] == "Layer" and "layer every view shows" in explained[ID.layer][1]
    told = explained[GID.new_tokens][1]
    assert "(1 to 512)" in told and "{" not in told  # the bound as a number, not its name
    bar = next(n for n in nodes_in(page) if getattr(n, "className", None) == "av-viewbar")
    assert {ID.layer, ID.head, ID.words, ID.measure, ID.export_format, ID.csv_button} <= ids_in(bar)


def test_the_temperature_reads_as_the_temperature_not_its_logarithm():
    """The slider moves log10 T; beside it the page shows T (1 at the slider's middle), never the slider's 0."""
    from attnviz.dashboard.lab_view import temperature_text

    assert [temperature_text(v) for v in (0, None, -1, -0.5, 0.5, 1)] == ["1", "1", "0.1", "0.32", "3.2", "10"]
    page = build_layout([{"label": "m", "value": "m"}], "m", "The cat sat.")
    slider = next(n for n in nodes_in(page) if getattr(n, "id", None) == ID.lab_temperature)
    shown = next(n for n in nodes_in(page) if getattr(n, "id", None) == ID.lab_temperature_value)
    assert slider.value == 0 and slider.allow_direct_input is False and shown.children == "1"


def test_a_result_a_button_draws_is_never_an_empty_pair_of_axes_before_it():
    """A reviewer read six charts as broken: under *Apply to the model*, *Test it*, *Map head importance* and
    *Run probe set* the page showed blank axes (−1…4 × 0…6) until the button was pressed. A graph that only
    a button's click fills (every callback drawing it waits for a click) starts with a figure of its own,
    axes hidden: a line saying what the button draws there, or nothing."""
    from attnviz.dashboard import create_app
    from dash import dcc

    app = create_app({"minilm": "MiniLM (BERT)"}, default_model="minilm")
    layout = app.layout() if callable(app.layout) else app.layout
    graphs = {node.id: node for node in nodes_in(layout) if isinstance(node, dcc.Graph)}
    by_click: dict[str, list[bool]] = {}
    for callback in app._callback_list:
        outputs = callback["output"]
        for output in outputs.strip(".").split("...") if outputs.startswith("..") else [outputs]:
            graph, prop = output.rsplit(".", 1)
            if prop == "figure" and graph in graphs:
                clicks = bool(callback["inputs"]) and all(i["property"] == "n_clicks" for i in callback["inputs"])
                by_click.setdefault(graph, []).append(clicks and bool(callback["prevent_initial_call"]))
    waiting = sorted(graph for graph, each in by_click.items() if all(each))
    assert len(waiting) >= 6, waiting  # the Lab's two, Test it's, the importance map, the probe set's two
    for graph in waiting:
        figure = graphs[graph].figure
        assert figure is not None, f"{graph} starts as an empty pair of axes"
        assert figure.layout.xaxis.visible is False and figure.layout.yaxis.visible is False, graph


def test_each_view_module_registers_one_view_and_the_page_reads_the_registry():
    """One registry (``registry.py``): every ``*_view`` module registers itself once; the tabs, their order and
    the slots the hosts offer are read from it, never listed again."""
    from attnviz.dashboard import registry
    from attnviz.dashboard.layout import VIEWS

    views = registry.views()
    modules = {view.register.__module__ for view in views}  # the lambda each module wrote in its own registration
    assert sorted(m.rsplit(".", 1)[1] for m in modules) == registry.view_modules() == [p.stem for p in VIEW_FILES]
    assert len(views) == len(VIEW_FILES) and len({v.id for v in views}) == len(views)
    assert VIEWS == [(v.id, v.label) for v in views if v.label is not None]
    assert VIEWS[0] == ("heatmap", "Heatmap") and len(VIEWS) == 14  # 14: the Training tab (issue 45)
    declared = {(f"{v.id}", slot) for v in views for slot in v.slots}
    hosts = {v.id: v.register.__module__.rsplit(".", 1)[1] for v in views}
    placed = {(host, slot) for host, slot, stem in slot_calls("slot_panels") if hosts.get(host) == stem}
    assert declared == placed == {(host, slot) for host, slot, _ in panels.registered()}
    page = build_layout([{"label": "m", "value": "m"}], "m", "The cat sat.")
    tabs = next(n for n in nodes_in(page) if getattr(n, "id", None) == ID.tabs)
    assert [(t.value, t.label) for t in tabs.children] == VIEWS
    assert {view_id(key) for key, _ in VIEWS} <= ids_in(page)


def test_the_registry_refuses_a_tab_without_a_layout():
    from attnviz.dashboard.registry import View, registers

    with pytest.raises(ValueError, match="a tab has a label and a layout"):
        registers(View("nowhere", "Nowhere", order=0, register=lambda app, server: None))
