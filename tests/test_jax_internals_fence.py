"""JAX's internals are read in one place: equation parameters (a scan's body and
operand counts, a cond's branches, a call's jaxpr, genvi's own site parameters) are
read only in `genvi/core/` (the typed views `ScanEqn`, `CondEqn`, `CallEqn`,
`WhileEqn` and `SiteEqn`, and the axis rules of the rule registry,
`genvi/core/axis_rules.py`, each reading the parameters of its structure's
primitives). A JAX release that renames a parameter then touches `genvi/core/` only.

Every module of `genvi/` is read with `ast`: an attribute `.params` of an equation
(a name ending in `eqn`, or one of the loop names `e`, `s`, an indexed equation) is
allowed only in those modules. Modules that import `jax.extend.core`,
`jax.interpreters` or `jax._src` are allowed only in `genvi/core/`.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "genvi"
# rule tables: one rule per primitive, each reading its primitive's own parameters;
# a rule table's module says so in its name
RULE_TABLES: set[str] = set()  # none today: the axis rules live in genvi/core/axis_rules.py
EQUATION_NAMES = {"e", "s", "at"}


def _is_equation(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript):
        return _is_equation(node.value)
    if isinstance(node, ast.Name):
        return node.id.endswith(("eqn", "eqns")) or node.id in EQUATION_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("eqn")
    return False


def _readers(path: pathlib.Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "params"
            and _is_equation(node.value)]


def _outside_core() -> list[pathlib.Path]:
    return [p for p in sorted(LIBRARY.rglob("*.py"))
            if p.relative_to(ROOT).parts[1] != "core"]


def test_equation_parameters_are_read_only_in_core_and_rule_tables():
    found = {str(p.relative_to(ROOT)): lines for p in _outside_core()
             if str(p.relative_to(ROOT)) not in RULE_TABLES and (lines := _readers(p))}
    assert not found, ("JAX equation parameters read outside genvi/core/ (use a typed view: "
                       f"ScanEqn, CondEqn, CallEqn, WhileEqn, SiteEqn): {found}")


def test_rule_tables_are_named_as_such():
    assert all(name.endswith("rules.py") and (ROOT / name).is_file() for name in RULE_TABLES)


def test_the_fence_finds_a_reader():
    # the check itself sees the forms it forbids
    src = "x = eqn.params['length']\ny = eqns[0].params\nz = self.eqn.params\nw = result.params"
    tree = ast.parse(src)
    hits = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and n.attr == "params" and _is_equation(n.value)]
    assert sorted(hits) == [1, 2, 3]


def test_jax_internal_modules_are_imported_only_in_core():
    internal = ("jax.extend", "jax.interpreters", "jax._src", "jax.core")
    found = {}
    for path in _outside_core():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad = [n for n in names if n.startswith(internal)]
            if bad:
                found.setdefault(str(path.relative_to(ROOT)), []).extend(bad)
    assert not found, found


# -- dispatch by type, never by name ---------------------------------------------------
#
# Outside genvi/core no code decides what an equation is by a string: no
# `jx.kind(eqn) == "scan"`, no `eqn.primitive.name`, no loop over a jaxpr's `.eqns`.
# Interpreters receive typed views (`jx.view`, `Hooks.control`), compare primitives
# as objects, and ask `genvi.core.rules` for a primitive's structure; a name shown in
# a message comes from `jx.name_of`. (A module still to move onto the typed hooks would
# be listed here with what it reads; none is.)
STILL_BY_NAME: dict = {}


def _by_name(tree: ast.AST) -> set[str]:
    """What a module reads by name: a call of `.kind(...)`, `<x>.primitive.name`,
    `<x>.eqns`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "kind":
            found.add("kind")
        if isinstance(node, ast.Attribute):
            if node.attr == "name" and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "primitive":
                found.add("primitive.name")
            if node.attr == "eqns":
                found.add("eqns")
    return found


def test_no_dispatch_by_name_outside_core():
    found = {str(p.relative_to(ROOT)): reads for p in _outside_core()
             if (reads := _by_name(ast.parse(p.read_text())))}
    assert found == STILL_BY_NAME, (
        "equation kinds, primitive names or a jaxpr's equations read outside genvi/core/ "
        "(use jx.view / Hooks.control, primitive objects, genvi.core.rules.structure_of, "
        f"jx.name_of for messages); found {found}, the known list {STILL_BY_NAME}")


def test_the_name_fence_finds_each_form():
    src = ("a = jx.kind(eqn) == 'scan'\nb = eqn.primitive.name\nc = jaxpr.eqns\n"
           "d = eqn.primitive is sin_p\ne = '''eqn.primitive.name in a docstring'''")
    assert _by_name(ast.parse(src)) == {"kind", "primitive.name", "eqns"}
    assert _by_name(ast.parse("d = eqn.primitive is sin_p")) == set()


def test_every_primitive_set_is_built_by_name_in_core_rules_only():
    found = {}
    for path in _outside_core():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("primitives", "primitive")):
                found.setdefault(str(path.relative_to(ROOT)), []).append(node.lineno)
    assert not found, ("primitive sets built from names outside genvi/core/rules.py: "
                       f"{found}")


def test_a_name_the_running_jax_lacks_is_an_error_not_an_omission(monkeypatch):
    import pytest

    from genvi.core import rules
    without_lt = {k: v for k, v in rules._BY_NAME.items() if k != "lt"}
    monkeypatch.setattr(rules, "_BY_NAME", without_lt)
    # the discontinuity check's comparisons, built on a JAX that renamed `lt`: refused
    with pytest.raises(rules.MissingPrimitive, match=r"no primitive named lt: .*rules\.py"):
        rules.primitives("lt le gt ge eq ne".split())


VIEWS = {"ScanEqn", "CondEqn", "CallEqn", "CustomEqn", "WhileEqn"}


def _dispatch_by_view(tree: ast.AST) -> list[int]:
    """Lines that dispatch on a control-flow equation's kind by hand: `isinstance` on
    a typed view, or `jx.view(eqn)` (the `Hooks` of genvi.core.walk hand an
    interpreter each kind's view instead)."""
    def names_view(node: ast.AST) -> bool:
        return any(isinstance(n, (ast.Attribute, ast.Name))
                   and (n.attr if isinstance(n, ast.Attribute) else n.id) in VIEWS
                   for n in ast.walk(node))

    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if (isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                and len(node.args) == 2 and names_view(node.args[1])):
            lines.append(node.lineno)
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "view" and (
                isinstance(node.func.value, ast.Name) and node.func.value.id == "jx"):
            lines.append(node.lineno)
    return lines


def test_every_interpreter_receives_control_flow_through_hooks():
    found = {str(p.relative_to(ROOT)): lines for p in _outside_core()
             if (lines := _dispatch_by_view(ast.parse(p.read_text())))}
    assert not found, ("control flow dispatched by hand outside genvi/core (subclass "
                       f"genvi.core.walk.Hooks instead): {found}")


def test_the_hooks_fence_finds_each_form():
    src = ("a = isinstance(v, jx.ScanEqn)\nb = isinstance(v, (jx.CondEqn, int))\n"
           "c = jx.view(eqn)\nd = isinstance(v, Local)\ne = isinstance(v, CustomEqn)\n")
    assert _dispatch_by_view(ast.parse(src)) == [1, 2, 3, 5]
