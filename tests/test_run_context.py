"""What a run is for lives in one record, and handlers receive one record per site.

* `genvi.core.context.RunContext` holds what used to be separate ambient flags (an
  objective's body, values only, genvi's cond batching, lane-local replays,
  `explain`'s log, the program validation names). Interpreters read it once where a
  run begins and pass it down: no module outside `genvi/core/` declares context
  state of its own.
* A handler's `site` and `observe` receive a `gv.handlers.Site` (address,
  distribution, parameters, strategy, plate scale, shape, location, observed value),
  as NumPyro's handlers receive `msg`.
"""

from __future__ import annotations

import ast
import pathlib

import jax
import jax.numpy as jnp
import pytest

import genvi as gv
from genvi.core.context import RunContext, current, using

LIBRARY = pathlib.Path(__file__).resolve().parents[1] / "genvi"
# where genvi keeps context: the run context; the name scope of nested program calls
# and validation's switch (both part of JAX's jit cache key); the notes tracing keeps
# of what a program's Python did
CONTEXT_HOMES = {"core/context.py", "core/addressing.py", "core/validation.py",
                 "core/tracing.py"}


def _declares_context(path: pathlib.Path) -> list[int]:
    tree = ast.parse(path.read_text())
    def declares(call: ast.Call) -> bool:
        name = getattr(call.func, "attr", getattr(call.func, "id", None))
        owner = getattr(getattr(call.func, "value", None), "id", None)
        return (name in ("ContextVar", "make_user_context")
                or (name == "local" and owner == "threading"))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and declares(node)]


def test_context_state_is_declared_only_in_its_homes():
    found = {str(p.relative_to(LIBRARY)): lines for p in sorted(LIBRARY.rglob("*.py"))
             if str(p.relative_to(LIBRARY)) not in CONTEXT_HOMES
             and (lines := _declares_context(p))}
    assert not found, f"context state outside genvi/core's homes (use RunContext): {found}"


def test_the_fence_sees_a_declaration(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import contextvars, threading\nX = contextvars.ContextVar('x', default=0)\n"
                    "Y = threading.local()\nZ = local(1)\n")
    assert _declares_context(path) == [2, 3]


def test_using_sets_fields_for_a_block_and_restores_them():
    assert current() == RunContext()
    with pytest.raises(RuntimeError):
        with using(lane_local=False, program="program 'g'"):
            assert (current().lane_local, current().program) == (False, "program 'g'")
            with using(plain=True):
                assert current().plain and not current().lane_local
            raise RuntimeError
    assert current() == RunContext()


def test_explain_and_whole_objective_replays_are_fields_of_the_run_context():
    from genvi.replays.engine import whole_objective_replays
    with whole_objective_replays():
        assert current().lane_local is False
    assert current().lane_local is True


class Seen(gv.handlers.Simulate):
    def __init__(self):
        self.sites, self.observations = [], []

    def site(self, site, state):
        self.sites.append(site)
        return super().site(site, state)

    def observe(self, site, state):
        self.observations.append(site)
        return super().observe(site, state)


def test_a_handler_receives_a_site_record():
    @gv.gen
    def point(y):
        z = gv.normal(0.0, 2.0, grad=gv.REPARAM) @ "z"
        gv.observe(gv.normal(z, 1.0), y)
        return z

    @gv.gen
    def model(ys):
        mu = gv.normal(0.0, 1.0) @ "mu"
        return gv.plate(point, 3)(ys + mu) @ "points"

    seen = Seen()
    model.interpret(seen, jnp.zeros(3), key=jax.random.key(0))
    top, inner = seen.sites
    assert top.addr == ("mu",) and top.dist is gv.normal and top.strategy is None
    assert top.scale == 1.0 and top.shape == () and top.observed is None
    assert "test_run_context.py" in top.location
    assert inner.addr[-1] == "z" and inner.strategy is gv.REPARAM
    assert bool(jnp.all(inner.params[1] == 2.0)) and inner.shape == (3,)
    (obs,) = seen.observations
    assert obs.addr is None and obs.dist is gv.normal and obs.observed is not None
    assert "test_run_context.py" in obs.location and not obs.missing


def test_plate_scales_reach_the_site_record():
    @gv.gen
    def row(x):
        gv.observe(gv.normal(x, 1.0), 0.0)

    @gv.gen
    def model(xs):
        gv.plate(row, 100)(xs) @ "rows"   # 4 of 100 datapoints: each weighs 25

    seen = Seen()
    model.interpret(seen, jnp.zeros(4), key=jax.random.key(0))
    (obs,) = seen.observations
    assert obs.scale == 25.0
