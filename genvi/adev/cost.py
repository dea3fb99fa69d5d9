"""What a step costs, counted without running it: the operations of its jaxpr, and the
kernels, instructions and elements of XLA's compiled program, every loop at its trip
count; and a CPU time model that weighs those counts.

XLA's own cost analysis counts each loop body once, so it cannot see that a scan's
replays run T times, nor that a scan XLA:CPU did not compile into one kernel runs its
body kernel by kernel, paying a launch for every operation at every step, while one it
did compile whole runs its instructions as tight scalar code. The counts here see all
three; `explain` prints them and the model's estimate.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from genvi.adev.cost import compiled_work
    >>> hlo = jax.jit(lambda x: jnp.sin(x) * 2.0).lower(jnp.ones(8)).compile().as_text()
    >>> compiled_work(hlo).launches, compiled_work(hlo).elements
    (1, 24)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from genvi.core import jaxpr as jx
from genvi.core.walk import Hooks, walk


def work(jaxpr: Any) -> tuple[float, float]:
    """(operations executed, elements they write) by a jaxpr, every loop at its trip
    count: a scan's body `length` times, a cond's costliest branch, a while loop's body
    once (its trip count is not known).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.adev.cost import work
        >>> step = lambda c, _: (c * 2.0 + 1.0, None)
        >>> work(jax.make_jaxpr(lambda c: jax.lax.scan(step, c, None, length=10))(jnp.ones(3)))
        (20.0, 60.0)
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    counter = _Work()
    walk(jaxpr, dict.fromkeys(list(jaxpr.constvars) + list(jaxpr.invars)), counter,
         literal=lambda _: None)
    return counter.ops, counter.elements


class _Work(Hooks):
    """`work`'s hooks: a walk over no values that adds up each equation's cost."""

    def __init__(self) -> None:
        self.ops = self.elements = 0.0

    def _add(self, eqn: Any, ops: float, elements: float) -> list:
        self.ops, self.elements = self.ops + ops, self.elements + elements
        return [None] * len(eqn.outvars)

    def interprets(self, eqn: Any, ins: list) -> bool:
        return bool(jx.sub_jaxprs(eqn))

    def scan(self, i, view, ins):
        o, e = work(view.body)
        return self._add(view.eqn, view.length * o, view.length * e)

    def cond(self, i, view, ins):
        return self._add(view.eqn, *max(work(b) for b in view.branches))

    def call(self, i, view, ins):
        return self.unsupported(i, view.eqn, ins)

    def unsupported(self, i, eqn, ins):  # a while loop's body once, a custom rule's call
        o, e = (sum(x) for x in zip(*(work(j) for j in jx.sub_jaxprs(eqn))))
        return self._add(eqn, o, e)

    def other(self, i, eqn, ins):
        return self._add(eqn, 1.0, float(sum(math.prod(getattr(v.aval, "shape", ()))
                                                 for v in eqn.outvars)))


class CompiledWork(NamedTuple):
    """What one run of a compiled step executes, loops at their trip counts:
    `launches`, kernels run one after another (a fusion, a lone operation, a loop XLA:CPU
    compiled whole); `instructions`, HLO instructions executed inside the kernels that are
    launched one by one; `elements`, array elements the instructions produce (a
    dynamic-update-slice: its update's); `looped`, instructions executed inside loops
    XLA:CPU compiled into one kernel, which run as tight scalar code and cost far less
    each than a launched kernel's instructions."""

    launches: int
    instructions: int
    elements: int
    looped: int = 0

    def __add__(self, other: tuple) -> CompiledWork:  # type: ignore[override]
        return CompiledWork(*(a + b for a, b in zip(self, other)))

    def __mul__(self, n: int) -> CompiledWork:  # type: ignore[override]
        return CompiledWork(*(a * n for a in self))


_NOTHING = CompiledWork(0, 0, 0, 0)
_LAUNCHED, _FUSED, _LOOPED = "launched", "fused", "looped"
_SETUP_OPS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                        "after-all"})
_ARRAY_TYPE = re.compile(r"\b(?:pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")
_CALLED = re.compile(r"\b(body|condition|to_apply|calls)=(%[\w.\-]+)")


def compiled_work(hlo: str) -> CompiledWork:
    """Count what a compiled step executes from XLA's optimized HLO text
    (`jax.jit(f).lower(...).compile().as_text()`): every loop at its known trip count, a
    conditional's costliest branch, a loop that XLA:CPU compiled into one kernel (a
    "small call": it touches under 1 KiB per step and holds no dot or scatter) as one
    launch whose instructions run at their trip counts.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.adev.cost import compiled_work
        >>> loop = lambda c: jax.lax.scan(lambda c, _: (jnp.sin(c) + jnp.roll(c, 1), None),
        ...                               c, None, length=50)[0]
        >>> w = compiled_work(jax.jit(loop).lower(jnp.ones(64)).compile().as_text())
        >>> w.launches + w.looped >= 50   # the body's work, at every one of the 50 steps
        True
    """
    computations, entry = {}, None
    for block in re.split(r"\n(?=\S)", hlo):
        m = re.match(r"(ENTRY )?(%[\w.\-]+)", block)
        if m:
            computations[m.group(2)] = [_Instruction.parse(line)
                                        for line in block.splitlines()[1:]]
            entry = m.group(2) if m.group(1) else entry
    defined = {i.name: i for body in computations.values() for i in body if i}

    def produced(i: _Instruction) -> int:
        if i.opcode == "dynamic-update-slice" and len(i.operands) > 1:
            return defined[i.operands[1]].elements if i.operands[1] in defined else 1
        return i.elements

    def count(name: str | None, where: str) -> CompiledWork:
        """`where`: LAUNCHED (each operation a kernel), FUSED (inside one kernel) or
        LOOPED (inside a loop compiled into one kernel)."""
        total = _NOTHING
        for i in computations.get(name, []):
            if i is None or i.opcode in _SETUP_OPS:
                continue
            launch = int(where == _LAUNCHED)
            if i.opcode == "while":
                trips = re.search(r'known_trip_count":\{"n":"(\d+)"', i.line)
                total += (count(i.called["body"], where) + count(i.called["condition"], where)
                          ) * (int(trips.group(1)) if trips else 1)
            elif i.opcode == "conditional":
                branches = re.search(r"branch_computations=\{([^}]*)\}", i.line)
                names = branches.group(1).split(", ") if branches else []
                total += max((count(b, where) for b in names), default=_NOTHING) + (
                    launch, *_one(where, 0))
            elif i.opcode in ("call", "fusion") and i.called:
                inner = i.called.get("to_apply") or i.called.get("calls")
                kernel = (_LOOPED if "xla_cpu_small_call" in i.line
                          else _FUSED if i.opcode == "fusion" else None)
                if launch and kernel:  # one kernel launched here, its body inside it
                    total += count(inner, kernel) + (1, 0, 0, 0)
                else:
                    total += count(inner, where)
            else:
                total += (launch, *_one(where, produced(i)))
        return total
    return count(entry, _LAUNCHED) if entry else _NOTHING


def _one(where: str, elements: int) -> tuple[int, int, int]:
    """(instructions, elements, looped) of one instruction executed `where`."""
    return (0, elements, 1) if where == _LOOPED else (1, elements, 0)


@dataclass(frozen=True)
class _Instruction:
    """One line of HLO text: `%name = TYPE opcode(operands), attributes`."""

    name: str
    opcode: str
    elements: int
    operands: tuple
    called: dict
    line: str

    @staticmethod
    def parse(line: str) -> _Instruction | None:
        if " = " not in line:
            return None
        lhs, rest = line.split(" = ", 1)
        type_text, opcode, after = _split_type(rest)
        if opcode is None:
            return None
        elements = sum(math.prod(int(d) for d in dims.split(",") if d)
                       for dims in _ARRAY_TYPE.findall(type_text))
        operands = tuple(re.findall(r"%[\w.\-]+", after.split(")", 1)[0]))
        return _Instruction(lhs.split()[-1], opcode, elements, operands,
                            dict(_CALLED.findall(after)), line)


def _split_type(rest: str) -> tuple[str, str | None, str]:
    """`TYPE opcode(...)...` → (TYPE, opcode, the text after `opcode(`)."""
    if rest.startswith("("):  # a tuple type: skip to its closing parenthesis
        depth = 0
        for end, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                break
        type_text, rest = rest[:end + 1], rest[end + 1:]
    else:
        type_text, _, rest = rest.partition(" ")
    m = re.match(r"\s*([a-z][\w\-]*)\(", rest)
    return (type_text, m.group(1), rest[m.end():]) if m else (type_text, None, "")


@dataclass(frozen=True)
class CpuTimeModel:
    """A step's time on a CPU from its `CompiledWork`: a fixed cost per call, and a cost
    per kernel launched, per instruction executed in a launched kernel, per element
    produced and per instruction executed inside a loop compiled whole (tight scalar
    code: about a fourteenth of a launched kernel's instruction). The defaults are the
    mean of two fits by `python -m genvi_experiments.bench.replays.explain_calibration`
    (2026-11-24; x86_64, 2 cores, JAX 0.10.2, XLA:CPU) on the gradient steps of the
    plate and HMM benches at their smaller sizes; the script checks them on the larger
    sizes, and prints this machine's fit.

    Example:
        >>> from genvi.adev.cost import CompiledWork, CpuTimeModel
        >>> model = CpuTimeModel(fixed_us=10.0, launch_ns=100.0, instruction_ns=1.0,
        ...                      element_ns=0.1, looped_ns=0.5)
        >>> model.microseconds(CompiledWork(10, 1000, 10000, looped=4000))
        15.0
    """

    fixed_us: float = 42.4
    launch_ns: float = 6.3
    instruction_ns: float = 9.5
    element_ns: float = 0.063
    looped_ns: float = 0.68

    def microseconds(self, executed: CompiledWork) -> float:
        return self.fixed_us + 1e-3 * (self.launch_ns * executed.launches
                                       + self.instruction_ns * executed.instructions
                                       + self.element_ns * executed.elements
                                       + self.looped_ns * executed.looped)
