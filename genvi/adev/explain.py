"""`objective.explain(*args)`: what the gradient estimator does at each site, and what
it costs.

While an estimator is traced with a log open, the ADEV interpreter notes every
sampling site it differentiates (address, distribution, strategy, the plates and scans
around it and its lanes) and how the site's replays are evaluated: none (REPARAM,
REINFORCE), lane-local (one evaluation of the rest of the objective for all lanes),
whole-objective replays (one per lane and alternative), or exact enumeration of the
rest of the program. The compiled value and gradient steps' FLOPs (XLA's cost
analysis) put a number on it: someone asking "why is this step 20× slower than
REINFORCE?" reads the answer off the table.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from typing import Any

import jax

from genvi.core import jaxpr as jx
from genvi.core.tracing import split_args

_LOG: contextvars.ContextVar = contextvars.ContextVar("genvi_estimator_log", default=None)


def note_site(eqn: Any, dist: Any, strategy: Any, value: Any, steps: tuple) -> None:
    """Record a differentiated site (when a log is open)."""
    log = _LOG.get()
    if log is None or id(eqn) in log:
        return
    within = []
    for s in steps:
        if hasattr(s, "primitive"):
            k = jx.kind(s)
            if k == "scan":
                within.append(f"scan({s.params['length']})")
            elif k == "cond":
                within.append("cond")
    addr = eqn.params.get("addr")
    log[id(eqn)] = dict(addr="/".join(map(str, addr)) if addr else "(gv.sample)",
                        dist=f"gv.{getattr(dist, 'name', '?')}", strategy=repr(strategy),
                        shape=tuple(getattr(value, "shape", ())), within=within,
                        replays="none")


def note_replays(eqn: Any, alternatives: Any, path: str) -> None:
    """Record how a site's replays are evaluated (`alternatives`: `[J, *lanes]`)."""
    shape = getattr(alternatives, "shape", (1,))
    lanes = math.prod(shape[1:])
    note_path(eqn, f"{shape[0]} × {lanes} lane{'s' if lanes != 1 else ''}: {path}")


def note_path(eqn: Any, text: str) -> None:
    """Record how a site's alternatives are evaluated, in words."""
    log = _LOG.get()
    if log is not None and id(eqn) in log:
        log[id(eqn)]["replays"] = text


def note_enumeration(eqn: Any, values: int) -> None:
    note_path(eqn, f"rest of the program at {values} values (exact enumeration)")


@dataclass
class Explanation:
    """The sites of an objective's gradient estimator and the cost of its steps.
    `print` it for a table."""

    name: str
    sites: list = field(default_factory=list)
    flops_value: float = float("nan")
    flops_gradient: float = float("nan")

    def __str__(self) -> str:
        rows = [("address", "distribution", "strategy", "within", "shape", "replays")]
        for s in self.sites:
            shape = "×".join(map(str, s["shape"])) or "scalar"
            rows.append((s["addr"], s["dist"], s["strategy"], " > ".join(s["within"]) or "top",
                         shape, s["replays"]))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"gradient estimator of {self.name}:"]
        for j, r in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
            if j == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        ratio = self.flops_gradient / self.flops_value if self.flops_value else float("nan")
        lines.append(f"compiled value step: {self.flops_value:,.0f} FLOPs; gradient step: "
                     f"{self.flops_gradient:,.0f} FLOPs ({ratio:.1f}× the value)")
        return "\n".join(lines)

    __repr__ = __str__


def _flops(compiled: Any) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float((cost or {}).get("flops", float("nan")))


def explain(objective: Any, key: Any, args: tuple, argnums: tuple) -> Explanation:
    """Trace `objective`'s gradient estimator afresh with the log open; compile the
    value and gradient steps for their FLOPs."""
    log: dict = {}
    token = _LOG.set(log)
    try:
        # fresh functions (not the objective's cached ones), so the estimator is traced
        def grad_step(key, *a):
            return objective._value_and_grad_uncached(key, a, argnums)
        gradient = jax.jit(grad_step).lower(key, *args).compile()
    finally:
        _LOG.reset(token)
    value = jax.jit(lambda key, *a: objective._value_fn(key, a)(
        split_args(a)[0])).lower(key, *args).compile()
    return Explanation(objective._label, list(log.values()),
                       _flops(value), _flops(gradient))
