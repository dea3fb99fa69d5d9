"""`objective.explain(*args)`: what the gradient estimator does at each site, and what
it costs.

While an estimator is traced, the ADEV interpreter reports what it does to the run's
observer (`genvi.core.context.RunObserver`); `explain`'s observer, `SiteLog`, notes every
sampling site it differentiates (address, distribution, strategy, the plates and scans
around it and its lanes) and how the site's replays are evaluated: none (REPARAM,
REINFORCE), lane-local (one evaluation of the rest of the objective for all lanes),
whole-objective replays (one per lane and alternative), or exact enumeration of the
rest of the program, and how many times in all each site runs the rest of the
objective (`runs`: alternatives × lanes × the steps of the scans around it). Then
the cost of the value and gradient steps (`genvi.adev.cost`), every loop at its trip
count: the operations of their jaxprs (`work_*`); the kernels run one after another,
instructions and elements of XLA's compiled programs (`compiled_*`), where a scan that
XLA:CPU did not compile into one kernel pays a launch per operation per step; a CPU
time estimate from those (`microseconds_*`, `CpuTimeModel`); and XLA's FLOPs
(`flops_*`), which count each loop body once. Someone asking "why is this step 20×
slower than REINFORCE?" reads the answer off the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import jax

from genvi.adev.cost import CompiledWork, CpuTimeModel, compiled_work, work
from genvi.core import jaxpr as jx
from genvi.core.context import RunObserver, using
from genvi.core.primitives import SiteEqn
from genvi.core.tracing import split_args
from genvi.core.address import Address

class SiteLog(RunObserver):
    """`explain`'s observer of a run: a record per differentiated site, by equation
    (`log`), kept by the `note_*` functions below."""

    def __init__(self) -> None:
        self.log: dict = {}
        self.untuned: list = []   # placeholder (gv.AUTO) sites left at their defaults
        self.contractions: dict = {}  # exact marginals' sums: program -> its steps

    def defaulted(self, sites):
        self.untuned.extend(s for s in sites if all(s.addr != u.addr for u in self.untuned))

    def site(self, eqn, dist, strategy, value, steps, draws=()):
        note_site(self.log, eqn, dist, strategy, value, steps, draws)

    def path(self, eqn, text):
        note_path(self.log, eqn, text)

    def replays(self, eqn, alternatives, path):
        note_replays(self.log, eqn, alternatives, path)

    def total(self, eqn, alternatives, total, scan_steps=1):
        note_total(self.log, eqn, alternatives, total, scan_steps)

    def enumeration(self, eqn, values):
        note_enumeration(self.log, eqn, values)

    def contraction(self, program, plan):
        self.contractions[program] = f"exact sum of {program}'s discrete sites:\n{plan}"


def note_site(log: dict | None, eqn: Any, dist: Any, strategy: Any, value: Any,
              steps: tuple, draws: tuple = ()) -> None:
    """Record a differentiated site in `log` (the run context's; None: not explaining);
    `draws`: the expectations whose draws it runs within, outermost first."""
    if log is None or id(eqn) in log:
        return
    within = [f"draw of {label}" for label in draws]
    # steps holds indices too; a scan's or cond's nesting in words and runs
    nestings = [n for s in steps if hasattr(s, "primitive") and (n := jx.nesting(s))]
    within += [words for words, _ in nestings]
    addr = SiteEqn.of(eqn).addr
    assert addr is not None  # a sampled site's: () for an unnamed draw
    repeat = math.prod(runs for _, runs in nestings)
    log[id(eqn)] = dict(addr=Address(addr).shown(),
                        dist=getattr(dist, "label", "?"), strategy=repr(strategy),
                        shape=tuple(getattr(value, "shape", ())), within=within,
                        replays="none", repeat=repeat, runs=0)


def note_replays(log: dict | None, eqn: Any, alternatives: Any, path: str,
                 lane_local: bool = False) -> None:
    """Record how a site's replays are evaluated (`alternatives`: `[J, *lanes]`, one
    step's; `path`: in words): `lane_local` ones run the rest once per alternative,
    whole-objective replays once per alternative and lane; at every step of the scans
    around it."""
    shape = getattr(alternatives, "shape", (1,))
    lanes = math.prod(shape[1:])
    note_path(log, eqn, f"{shape[0]} × {lanes} lane{'s' if lanes != 1 else ''}: {path}")
    _note_runs(log, eqn, shape[0] * (1 if lane_local else lanes))


def note_markov(log: dict | None, eqn: Any, alternatives: Any, steps: int, window: int,
                coupled: list) -> None:
    """Record Markov-local replays of a site in a scan of `steps` steps (`alternatives`:
    one step's, `[J, *lanes]`): the rest of the objective runs once per alternative for
    every step and lane at once, each step's body `window` + 1 times."""
    shape = getattr(alternatives, "shape", (1,))
    lanes = math.prod(shape[1:])
    note_path(log, eqn, f"{shape[0]} × {steps} steps × {lanes} lane{'s' if lanes != 1 else ''}: "
                   f"Markov-local, after the scan (a step's value reaches {window} "
                   f"step{'s' if window != 1 else ''})"
                   + (f" (lanes coupled at {', '.join(coupled)})" if coupled else ""))
    _note_runs(log, eqn, shape[0], steps)


def note_total(log: dict | None, eqn: Any, alternatives: Any, total: Any,
               scan_steps: int = 1) -> None:
    """Record how the replay engine evaluated a site's replays (`total`: its `Total`;
    `alternatives`: one step's, `[J, *lanes]`; `scan_steps`: the steps of the scan
    they ran after, when `total.after_scan`)."""
    coupled = f" (lanes coupled at {', '.join(total.coupled)})" if total.coupled else ""
    if total.path == "Markov-local":
        note_markov(log, eqn, alternatives, scan_steps, total.window, list(total.coupled))
        return
    if not total.after_scan:
        note_replays(log, eqn, alternatives, "lane-local" + coupled if total.path == "lane-local"
                     else "whole-objective replays", lane_local=total.path == "lane-local")
        return
    why_not = (f"; not Markov-local: {total.reason}"
               if total.reason and total.reason != "whole-objective replays asked for" else "")
    if total.path == "lane-local":
        note_replays(log, eqn, alternatives, "lane-local, after the scan" + coupled + why_not,
                     lane_local=True)
    else:
        note_replays(log, eqn, alternatives, "whole-objective replays, after the scan" + why_not)


def _note_runs(log: dict | None, eqn: Any, per_step: int, shared_by: int = 1) -> None:
    """`per_step` runs at each step of the scans around the site; `shared_by` of
    those steps share one run."""
    if log is not None and id(eqn) in log:
        log[id(eqn)]["runs"] = per_step * log[id(eqn)]["repeat"] // shared_by


def note_path(log: dict | None, eqn: Any, text: str) -> None:
    """Record how a site's alternatives are evaluated, in words."""
    if log is not None and id(eqn) in log:
        log[id(eqn)]["replays"] = text


def note_enumeration(log: dict | None, eqn: Any, values: int) -> None:
    note_path(log, eqn, f"rest of the program at {values} values (exact enumeration)")
    _note_runs(log, eqn, values)


@dataclass(frozen=True)
class StepCost:
    """What one step (the value or the gradient) costs: its jaxpr's operations and the
    elements they write (`work`), XLA's compiled program's kernels, instructions and
    elements (`compiled`), every loop at its trip count, and XLA's FLOPs (`flops`,
    each loop body once)."""

    work: tuple = (float("nan"), float("nan"))
    compiled: CompiledWork = CompiledWork(0, 0, 0, 0)
    flops: float = float("nan")

    @classmethod
    def of(cls, traced: Any) -> "StepCost":
        """The cost of a traced step (`jax.jit(step).trace(...)`), compiling it."""
        compiled = traced.lower().compile()
        return cls(work(traced.jaxpr), compiled_work(compiled.as_text()), _flops(compiled))


@dataclass
class Explanation:
    """The sites of an objective's gradient estimator and the cost of its steps.
    `print` it for a table.

    The sites are known once the estimator is traced; the steps' costs need XLA to
    compile them, so they are computed when first read (a cost attribute, `print`),
    and a caller that reads only `sites` compiles nothing."""

    name: str
    sites: list = field(default_factory=list)
    steps: dict = field(default_factory=dict, repr=False)  # "value"/"gradient" -> traced
    time_model: CpuTimeModel = CpuTimeModel()
    notes: list = field(default_factory=list)  # printed below the table (gv.AUTO's measurements)
    _costs: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def cost(self, step: str) -> StepCost:
        """The cost of the `"value"` or `"gradient"` step (compiled on first use)."""
        if step not in self._costs:
            traced = self.steps.get(step)
            self._costs[step] = StepCost() if traced is None else StepCost.of(traced)
        return self._costs[step]

    @property
    def flops_value(self) -> float:
        """XLA's FLOPs of the compiled value step (each loop body once)."""
        return self.cost("value").flops

    @property
    def flops_gradient(self) -> float:
        """XLA's FLOPs of the compiled gradient step (each loop body once)."""
        return self.cost("gradient").flops

    @property
    def work_value(self) -> tuple:
        """(operations, elements) of the value step's jaxpr, loops at their trip counts."""
        return self.cost("value").work

    @property
    def work_gradient(self) -> tuple:
        """(operations, elements) of the gradient step's jaxpr, loops at their trip counts."""
        return self.cost("gradient").work

    @property
    def compiled_value(self) -> CompiledWork:
        """The compiled value step's kernels, instructions and elements."""
        return self.cost("value").compiled

    @property
    def compiled_gradient(self) -> CompiledWork:
        """The compiled gradient step's kernels, instructions and elements."""
        return self.cost("gradient").compiled

    @property
    def microseconds_value(self) -> float:
        """The CPU time model's estimate for the value step."""
        return self.time_model.microseconds(self.compiled_value)

    @property
    def microseconds_gradient(self) -> float:
        """The CPU time model's estimate for the gradient step."""
        return self.time_model.microseconds(self.compiled_gradient)

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
        cv, cg = self.compiled_value, self.compiled_gradient
        lines.append(f"compiled, loops at their trip counts: value step {cv.launches:,} kernels "
                     f"run one after another, {cv.instructions:,} instructions in them, "
                     f"{cv.looped:,} in loops compiled whole, {cv.elements:,} elements; "
                     f"gradient step {cg.launches:,} kernels, {cg.instructions:,} instructions, "
                     f"{cg.looped:,} in loops, {cg.elements:,} elements")
        tv, tg = self.microseconds_value, self.microseconds_gradient
        lines.append(f"estimated CPU time: value step {tv:,.0f} µs; gradient step {tg:,.0f} µs, "
                     f"{tg / tv:.1f}× the value (`CpuTimeModel`: per kernel launched, "
                     "instruction, instruction in a loop compiled whole, and element)")
        ratio = self.flops_gradient / self.flops_value if self.flops_value else float("nan")
        lines.append(f"compiled value step: {self.flops_value:,.0f} FLOPs; gradient step: "
                     f"{self.flops_gradient:,.0f} FLOPs ({ratio:.1f}× the value; XLA counts "
                     "each loop body once)")
        return "\n".join(lines + self.notes)

    __repr__ = __str__


def _flops(compiled: Any) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float((cost or {}).get("flops", float("nan")))


def explain(objective: Any, key: Any, args: tuple, argnums: tuple) -> Explanation:
    """Trace `objective`'s gradient estimator afresh with the log open, and its value
    step; the explanation compiles both for their costs when those are first read. A
    `gv.AUTO` site left untuned (at its first allowed candidate) says so, in any
    objective built on a program."""
    notes = SiteLog()
    with using(observer=notes):  # the interpreter and the objectives report to `notes`
        # fresh functions (not the objective's cached ones), so the estimator is traced
        def grad_step(key, *a):
            return objective._value_and_grad_uncached(key, a, argnums)
        gradient = jax.jit(grad_step).trace(key, *args)

    def value_step(key, *a):
        return objective._value_fn(key, a)(split_args(a)[0])
    value = jax.jit(value_step).trace(key, *args)
    explanation = Explanation(objective._label, list(notes.log.values()),
                              steps={"value": value, "gradient": gradient})
    _mark_untuned(explanation, notes.untuned)
    explanation.notes.extend(notes.contractions.values())
    return explanation


def _mark_untuned(explanation: Explanation, untuned: list) -> None:
    """Mark each untuned `gv.AUTO` site's row and add a note naming its choice."""
    by_name = {site.name: site for site in untuned}
    for row in explanation.sites:
        site = by_name.get(row["addr"])
        if site is not None and row["strategy"] == repr(site.default):
            row["strategy"] = f"gv.AUTO (untuned) → {row['strategy']}"
    for site in by_name.values():
        refused = "".join(f"; {c!r} refused: {m}" for c, m in site.refused)
        explanation.notes.append(
            f"gv.AUTO at {site.name!r} untuned: {site.default!r}, the first candidate "
            f"the objective allows{refused}. gv.fit measures the candidates (gv.tune "
            "does it alone).")
