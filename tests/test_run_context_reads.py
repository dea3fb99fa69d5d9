"""The run context (`genvi.core.context`) is read where a run begins and passed down;
no primitive's bind reads it.

* Every read of the context in `genvi/` is counted here with the reason it sits where
  it does (read with `ast`): a new read fails this test until it is placed and named.
  The reads left are where a run begins (an objective's estimator, the ADEV
  interpreter started without a caller), and where a user's code calls genvi with
  nothing in hand: whether a call is inside an objective, the notes kept for the
  messages of mistakes, an exact marginal's plan for `explain`, and the batching
  rule of a `cond` (called by JAX, docs/architecture.md).
* `gv.AUTO` sites are resolved in the traced jaxpr where the run begins
  (`genvi.adev.placeholders.resolved`), not at their binds: one trace of the user's
  objective serves every choice, sites in loop bodies, branches and calls included.
"""

from __future__ import annotations

import ast
import pathlib
from collections import Counter

import jax
import jax.numpy as jnp
import pytest

import genvi as gv
from genvi.adev import placeholders
from genvi.auto.choices import Tuned
from genvi.core import jaxpr as jx
from genvi.core.primitives import SiteEqn, sample_p

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "genvi"
KEY = jax.random.key(0)
FLAGS = {"IN_OBJECTIVE", "PLAIN", "GENVI_CONDS"}

# (module, function) -> reads of `current()`, and why the read is there
CONTEXT_READS = {
    ("adev/program.py", "dual_estimate"): 1,      # an objective's run begins
    ("adev/interpreter.py", "__init__"): 1,       # a run started without a caller's context
    ("core/tracing.py", "note_dist_call"): 1,     # user code called a distribution
    ("core/tracing.py", "note_site_value"): 1,    # a site returned a value to user code
    ("core/tracing.py", "note_scored"): 1,        # user code scored a program
    ("core/tracing.py", "note_sampled"): 1,       # user code sampled a program
    ("core/tracing.py", "__bool__"): 1,           # a flag (below)
    ("core/validation.py", "within"): 1,          # a run-time check's message names the program
    ("inference/enumeration/marginal.py", "exact_log_density"): 1,  # a plan, for `explain`
}
# (module, function) -> reads of a flag (`if not IN_OBJECTIVE`): each asks where the
# user's code that called genvi runs
FLAG_READS = {
    ("adev/sample.py", "sample"): 1,              # gv.sample outside an objective
    ("adev/expectation.py", "__call__"): 1,       # an objective called outside one
    ("adev/program.py", "__call__"): 1,
    ("gen/language.py", "_note_scored"): 1,       # a program scored inside an objective
    ("gen/language.py", "sim"): 1,                # g.sim outside an objective
    ("gen/handlers.py", "_objective_sample"): 1,  # a site without a strategy, values only
    ("gen/handlers.py", "_randomness"): 1,        # a key drawn where a density is scored
    ("inference/importance.py", "_require_objective"): 1,
    ("core/primitives.py", "_own_batching"): 2,   # JAX's cond rule asks (docs/architecture.md)
}


def _reads(path: pathlib.Path) -> tuple[Counter, Counter]:
    """Reads of `current()` and of a flag in the module at `path`, by enclosing function."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def function(node: ast.AST) -> str:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
        return "<module>"

    name = str(path.relative_to(LIBRARY))
    context, flags = Counter(), Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "current":
            context[(name, function(node))] += 1
        elif isinstance(node, ast.Name) and node.id in FLAGS and isinstance(node.ctx, ast.Load):
            parent = parents.get(node)
            setting = isinstance(parent, ast.Attribute)  # FLAG.set(): a block, not a read
            if not setting and not isinstance(parent, ast.ImportFrom):
                flags[(name, function(node))] += 1
    return context, flags


def test_the_run_context_is_read_only_where_counted():
    context, flags = Counter(), Counter()
    for path in sorted(LIBRARY.rglob("*.py")):
        if path.name == "context.py" and path.parent.name == "core":
            continue  # where the context is defined
        c, f = _reads(path)
        context.update(c)
        flags.update(f)
    assert dict(context) == CONTEXT_READS
    assert dict(flags) == FLAG_READS


def test_no_site_bind_reads_the_run_context():
    context, flags = _reads(LIBRARY / "core" / "primitives.py")
    assert not context
    assert set(flags) == {("core/primitives.py", "_own_batching")}


def _auto_in_control_flow():
    calls = []

    @gv.expectation
    def e(p):
        calls.append(1)

        def step(total, _):
            b = gv.sample(gv.flip(p, grad=gv.AUTO), name="b")
            return total + jnp.where(b, 1.0, 0.0), None

        total, _ = jax.lax.scan(step, 0.0, None, length=3)
        c = jax.jit(lambda q: gv.sample(gv.flip(q, grad=gv.AUTO), name="c"))(p)
        d = jax.lax.cond(p > 0.5, lambda: 2.0, lambda: jnp.where(
            gv.sample(gv.flip(p, grad=gv.AUTO), name="d"), 1.0, 0.0))
        return total + jnp.where(c, 1.0, 0.0) + d
    return e, calls


def test_choices_reach_sites_in_bodies_branches_and_calls():
    e, _ = _auto_in_control_flow()
    closed, _ = e.trace(0.3)
    assert {s.name for s in placeholders.placeholder_sites(closed)} == {"b", "c", "d"}
    choices = ((("b",), gv.ENUM), (("c",), gv.MVD), (("d",), gv.ENUM))
    assert placeholders.placeholder_sites(placeholders.resolved(closed, choices)) == []
    # the expectation is 3p + p + p (p < 0.5 takes the sampling branch): the gradient
    # is exactly 5 with these exact strategies
    assert float(Tuned(e, choices).grad_estimate(KEY, 0.3)) == pytest.approx(5.0, rel=1e-5)
    partial = placeholders.resolved(closed, choices[:1])
    assert {s.name for s in placeholders.placeholder_sites(partial)} == {"c", "d"}


def test_one_trace_of_the_objective_serves_every_choice():
    e, calls = _auto_in_control_flow()
    for strategy in (gv.ENUM, gv.MVD):
        choices = tuple(((a,), strategy) for a in "bcd")
        tuned = Tuned(e, choices)
        assert float(tuned.grad_estimate(KEY, 0.3)) == pytest.approx(5.0, rel=1e-5)
        sites = tuned.explain(0.3).sites
        assert {s["strategy"] for s in sites} == {f"gv.AUTO → {strategy!r}"}
    assert float(e.grad_estimate(KEY, 0.3)) == pytest.approx(5.0, rel=1e-5)  # defaults: ENUM
    assert len(calls) == 1


def test_the_first_choice_for_an_address_counts():
    e, _ = _auto_in_control_flow()
    closed, _ = e.trace(0.3)
    twice = placeholders.resolved(closed, ((("b",), gv.MVD), (("b",), gv.ENUM)))
    strategies = {SiteEqn.of(eqn).addr: SiteEqn.of(eqn).strategy
                  for eqn, _ in jx.equations(twice) if eqn.primitive is sample_p}
    assert strategies[("b",)] == gv.MVD and strategies[("c",)] == gv.AUTO


def test_a_choice_with_operands_is_refused():
    e, _ = _auto_in_control_flow()
    closed, _ = e.trace(0.3)
    with pytest.raises(ValueError, match=r"gv.AUTO at 'b' \(gv.flip\).*must be static"):
        placeholders.resolved(closed, ((("b",), gv.REINFORCE.with_baseline(0.5)),))
