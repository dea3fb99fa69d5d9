"""`objective.explain(*args)`: what the gradient estimator does at each site, and what
it costs.

While an estimator is traced with a log open, the ADEV interpreter notes every
sampling site it differentiates (address, distribution, strategy, the plates and scans
around it and its lanes) and how the site's replays are evaluated: none (REPARAM,
REINFORCE), lane-local (one evaluation of the rest of the objective for all lanes),
whole-objective replays (one per lane and alternative), or exact enumeration of the
rest of the program, and how many times in all each site runs the rest of the
objective (`runs`: alternatives × lanes × the steps of the scans around it). Two
numbers put a cost on it: the operations of the value and gradient steps counted on
their jaxprs with every loop at its trip count (`work_*`: a scan of T steps, the
`lax.map` that runs a scan's replays, count T times their body), and XLA's FLOPs of the
compiled steps (`flops_*`), which count each loop body once. Someone asking "why is
this step 20× slower than REINFORCE?" reads the answer off the table.
"""

from __future__ import annotations

import contextvars
import math
import re
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
    repeat = math.prod(s.params["length"] for s in steps
                       if hasattr(s, "primitive") and jx.kind(s) == "scan")
    log[id(eqn)] = dict(addr="/".join(map(str, addr)) if addr else "(gv.sample)",
                        dist=f"gv.{getattr(dist, 'name', '?')}", strategy=repr(strategy),
                        shape=tuple(getattr(value, "shape", ())), within=within,
                        replays="none", repeat=repeat, runs=0)


def note_replays(eqn: Any, alternatives: Any, path: str) -> None:
    """Record how a site's replays are evaluated (`alternatives`: `[J, *lanes]`, one
    step's): lane-local paths run the rest once per alternative, whole-objective
    replays once per alternative and lane; at every step of the scans around it."""
    shape = getattr(alternatives, "shape", (1,))
    lanes = math.prod(shape[1:])
    note_path(eqn, f"{shape[0]} × {lanes} lane{'s' if lanes != 1 else ''}: {path}")
    _note_runs(eqn, shape[0] * (1 if path.startswith("lane-local") else lanes))


def note_markov(eqn: Any, alternatives: Any, steps: int, window: int,
                coupled: list) -> None:
    """Record Markov-local replays of a site in a scan of `steps` steps (`alternatives`:
    one step's, `[J, *lanes]`): the rest of the objective runs once per alternative for
    every step and lane at once, each step's body `window` + 1 times."""
    shape = getattr(alternatives, "shape", (1,))
    lanes = math.prod(shape[1:])
    note_path(eqn, f"{shape[0]} × {steps} steps × {lanes} lane{'s' if lanes != 1 else ''}: "
                   f"Markov-local, after the scan (a step's value reaches {window} "
                   f"step{'s' if window != 1 else ''})"
                   + (f" (lanes coupled at {', '.join(coupled)})" if coupled else ""))
    _note_runs(eqn, shape[0], steps)


def _note_runs(eqn: Any, per_step: int, shared_by: int = 1) -> None:
    """`per_step` runs at each step of the scans around the site; `shared_by` of
    those steps share one run."""
    log = _LOG.get()
    if log is not None and id(eqn) in log:
        log[id(eqn)]["runs"] = per_step * log[id(eqn)]["repeat"] // shared_by


def note_path(eqn: Any, text: str) -> None:
    """Record how a site's alternatives are evaluated, in words."""
    log = _LOG.get()
    if log is not None and id(eqn) in log:
        log[id(eqn)]["replays"] = text


def note_enumeration(eqn: Any, values: int) -> None:
    note_path(eqn, f"rest of the program at {values} values (exact enumeration)")
    _note_runs(eqn, values)


@dataclass
class Explanation:
    """The sites of an objective's gradient estimator and the cost of its steps.
    `print` it for a table."""

    name: str
    sites: list = field(default_factory=list)
    flops_value: float = float("nan")
    flops_gradient: float = float("nan")
    work_value: tuple = (float("nan"), float("nan"))     # (operations, elements)
    work_gradient: tuple = (float("nan"), float("nan"))
    launches_value: int = 0       # kernels run one after another (`launches`)
    launches_gradient: int = 0

    def __str__(self) -> str:
        rows = [("address", "distribution", "strategy", "within", "shape", "runs", "replays")]
        for s in self.sites:
            shape = "×".join(map(str, s["shape"])) or "scalar"
            rows.append((s["addr"], s["dist"], s["strategy"], " > ".join(s["within"]) or "top",
                         shape, f"{s['runs']:,}", s["replays"]))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"gradient estimator of {self.name}:"]
        for j, r in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
            if j == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        (ov, ev), (og, eg) = self.work_value, self.work_gradient
        lines.append(f"operations executed, loops at their trip counts: value step {ov:,.0f} "
                     f"({ev:,.0f} elements); gradient step {og:,.0f} ({eg:,.0f} elements), "
                     f"{og / ov if ov else float('nan'):.1f}× the value")
        lv, lg = self.launches_value, self.launches_gradient
        lines.append(f"kernels run one after another, loops at their trip counts: value step "
                     f"{lv:,}; gradient step {lg:,}, {lg / lv if lv else float('nan'):.1f}× the "
                     "value (on a CPU each costs tens of ns)")
        ratio = self.flops_gradient / self.flops_value if self.flops_value else float("nan")
        lines.append(f"compiled value step: {self.flops_value:,.0f} FLOPs; gradient step: "
                     f"{self.flops_gradient:,.0f} FLOPs ({ratio:.1f}× the value; XLA counts "
                     "each loop body once)")
        return "\n".join(lines)

    __repr__ = __str__


def _flops(compiled: Any) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float((cost or {}).get("flops", float("nan")))


def work(jaxpr: Any) -> tuple[float, float]:
    """(operations executed, elements they write) by a jaxpr, every loop at its trip
    count: a scan's body `length` times, a cond's costliest branch, a while loop's body
    once (its trip count is not known). On a CPU a step's time is close to a fixed
    dispatch cost plus a few ns per operation executed while arrays are small, and
    follows the elements once they are large.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.adev.explain import work
        >>> step = lambda c, _: (c * 2.0 + 1.0, None)
        >>> work(jax.make_jaxpr(lambda c: jax.lax.scan(step, c, None, length=10))(jnp.ones(3)))
        (20.0, 60.0)
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    ops = elements = 0.0
    for eqn in jaxpr.eqns:
        kind, subs = jx.kind(eqn), jx.sub_jaxprs(eqn)
        if kind == "scan":
            o, e = work(eqn.params["jaxpr"])
            ops, elements = ops + eqn.params["length"] * o, elements + eqn.params["length"] * e
            continue
        if kind == "cond":
            o, e = max(work(b) for b in jx.cond_branches(eqn))
        elif subs:
            o, e = (sum(x) for x in zip(*(work(j) for j in subs)))
        else:
            o, e = 1.0, float(sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars))
        ops, elements = ops + o, elements + e
    return ops, elements


_SETUP_OPS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                        "after-all"})


def launches(hlo: str) -> int:
    """Kernels a compiled step runs one after another (XLA's optimized HLO text):
    every loop at its trip count, a loop that XLA:CPU compiled into one kernel (a
    "small call": it touches under 1 KiB per step and has no dot or scatter) as one.
    On a CPU each costs tens of ns however small it is, so a scan whose body is run
    kernel by kernel can cost more than all the arithmetic.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.adev.explain import launches
        >>> launches(jax.jit(jnp.sin).lower(jnp.ones(3)).compile().as_text())
        1
    """
    comps, entry = {}, None
    for block in re.split(r"\n(?=\S)", hlo):
        m = re.match(r"(ENTRY )?(%[\w.\-]+)", block)
        if m:
            comps[m.group(2)] = block.splitlines()[1:]
            entry = m.group(2) if m.group(1) else entry

    def count(name: str) -> int:
        total = 0
        for line in comps.get(name, []):
            op = _opcode(line)
            if op is None or op in _SETUP_OPS:
                continue
            called = dict(re.findall(r"(body|condition|to_apply)=(%[\w.\-]+)", line))
            if op == "while":
                trips = re.search(r'known_trip_count":\{"n":"(\d+)"', line)
                total += (int(trips.group(1)) if trips else 1) * (
                    count(called["body"]) + count(called["condition"]))
            elif op == "call" and "xla_cpu_small_call" not in line and "to_apply" in called:
                total += count(called["to_apply"])
            elif op == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", line)
                names = branches.group(1).split(", ") if branches else []
                total += 1 + max((count(b) for b in names), default=0)
            else:
                total += 1
        return total
    return count(entry) if entry else 0


def _opcode(line: str) -> str | None:
    """The opcode of one HLO instruction line (`%x = TYPE opcode(...)`)."""
    if " = " not in line:
        return None
    rest = line.split(" = ", 1)[1]
    if rest.startswith("("):  # a tuple type: skip to its closing parenthesis
        depth = 0
        for i, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                break
        rest = rest[i + 1:]
    else:
        rest = rest.partition(" ")[2]
    m = re.match(r"\s*([a-z][\w\-]*)\(", rest)
    return m.group(1) if m else None


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
        gradient_jaxpr = jax.make_jaxpr(grad_step)(key, *args)
    finally:
        _LOG.reset(token)

    def value_step(key, *a):
        return objective._value_fn(key, a)(split_args(a)[0])
    value = jax.jit(value_step).lower(key, *args).compile()
    return Explanation(objective._label, list(log.values()), _flops(value), _flops(gradient),
                       work(jax.make_jaxpr(value_step)(key, *args)), work(gradient_jaxpr),
                       launches(value.as_text()), launches(gradient.as_text()))
