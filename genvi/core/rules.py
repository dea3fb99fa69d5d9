"""One registry of how JAX's primitives move lane axes, keyed by `Primitive` objects.

The lane-tracked evaluator of replays (`genvi.replays.lane_rules`) and enumeration's
evaluator of values the same in every lane (`genvi.inference.enumeration.same`) both
ask two questions of an equation. What kind of structural operation is it?
Elementwise (lanes stay where they are), a reduction over some axes, an operation
along one axis (a cumulative sum, a sort), a broadcast, a transpose, a squeeze, a
reshape, a slice, a reversal, a padding, a contraction, a gather or a concatenation:
`STRUCTURE` answers it, keyed by the primitive objects themselves (as JAX keys its
batching rules). And where do its operands' lane axes go? `genvi.core.axis_rules`
answers it with one rule per structure, written once against a small interface. The
evaluators add only how they compute the values (both lanes' values, or one value for
all lanes). Which primitives a structure holds, and every other set of primitives an
interpreter reads (the comparisons the discontinuity check refuses, the operations
that keep a sum a sum), is written here once, by name; the names are turned into
primitive objects here, where JAX's modules are read (the fence), and a name the
running JAX lacks is an error (`MissingPrimitive`), never a set that silently shrinks.

Example:
    >>> import jax
    >>> eqn = jax.make_jaxpr(lambda x: jax.numpy.sin(x) * 2.0)(1.0).eqns[0]
    >>> structure_of(eqn)
    <Structure.ELEMENTWISE: 'elementwise'>
    >>> SORT in STRUCTURE, STRUCTURE[SORT]
    (True, <Structure.ALONG_AXIS: 'along_axis'>)
"""

from __future__ import annotations

import enum
import importlib
from typing import Any, Iterable

import jax
import jax.extend.core as jcore


class Structure(enum.Enum):
    """What a primitive does to its operands' axes (see the module docstring)."""

    ELEMENTWISE = "elementwise"      # operands of one shape, or scalars
    REDUCE = "reduce"                # over the `axes` parameter
    ALONG_AXIS = "along_axis"        # along one `axis` / `dimension`
    BROADCAST = "broadcast_in_dim"
    TRANSPOSE = "transpose"
    SQUEEZE = "squeeze"
    RESHAPE = "reshape"
    SLICE = "slice"
    REV = "rev"
    PAD = "pad"
    DOT_GENERAL = "dot_general"
    GATHER = "gather"
    CONCATENATE = "concatenate"


_NAMES = {
    Structure.ELEMENTWISE: """
        abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp
        convert_element_type copy cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1
        floor ge gt igamma igammac imag integer_pow is_finite le lgamma log log1p logistic
        lt max min mul ne neg nextafter not or polygamma pow real reduce_precision rem
        round rsqrt select_n sign sin sinh sqrt square stop_gradient sub tan tanh xor zeta
        bessel_i0e bessel_i1e shift_left shift_right_arithmetic shift_right_logical
        population_count""",
    Structure.REDUCE: """reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or
        argmax argmin""",
    Structure.ALONG_AXIS: "cumsum cumprod cummax cummin cumlogsumexp sort split",
    **{s: s.value for s in (Structure.BROADCAST, Structure.TRANSPOSE, Structure.SQUEEZE,
                            Structure.RESHAPE, Structure.SLICE, Structure.REV, Structure.PAD,
                            Structure.DOT_GENERAL, Structure.GATHER, Structure.CONCATENATE)},
}

# the modules of JAX that define the primitives above (some only in some releases)
_MODULES = ("jax.lax", "jax._src.lax.lax", "jax._src.lax.special", "jax._src.lax.slicing",
            "jax._src.lax.control_flow", "jax._src.lax.windowed_reductions",
            "jax._src.ad_util")


def _all_primitives() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # pragma: no cover - a module another release lacks
            continue
        for value in vars(module).values():
            if isinstance(value, jcore.Primitive):
                found.setdefault(value.name, value)
    return found


_BY_NAME = _all_primitives()


class MissingPrimitive(LookupError):
    """genvi names a primitive the running JAX does not define (renamed or dropped)."""


def primitives(names: Iterable[str]) -> frozenset:
    """The primitive objects of the given names, which this JAX release must define.

    Args:
        names: primitive names, as JAX prints them in a jaxpr.

    Returns:
        A frozenset of `jax.extend.core.Primitive`.

    Raises:
        MissingPrimitive: a name this release lacks: a rule that would leave it out
            could pass a program it should refuse, so it is an error, never an omission.

    Example:
        >>> import jax
        >>> primitives(["sin"]) == frozenset({jax.lax.sin_p})
        True
        >>> primitives(["no_such_primitive"])
        Traceback (most recent call last):
        ...
        genvi.core.rules.MissingPrimitive: ...
    """
    names = list(names)
    missing = [n for n in names if n not in _BY_NAME]
    if missing:
        raise MissingPrimitive(
            f"JAX {jax.__version__} defines no primitive named {', '.join(missing)}: genvi's "
            "tables in genvi/core/rules.py name it; a JAX release that renamed or dropped it "
            "needs its new name there")
    return frozenset(_BY_NAME[n] for n in names)


def primitive(name: str) -> Any:
    """The one primitive of `name` (`primitives`' check)."""
    (prim,) = primitives([name])
    return prim


#: primitive -> its structure: the one table both lane evaluators read
STRUCTURE: dict = {prim: structure for structure, names in _NAMES.items()
                   for prim in primitives(names.split())}

#: primitives some rules treat apart from the rest of their structure
REDUCE_SUM, SORT = primitive("reduce_sum"), primitive("sort")

# -- every other primitive set an interpreter reads, by name, here only -----------------
#: piecewise-constant functions of a smooth value (`genvi.adev.smoothness`)
STEP_FUNCTIONS = primitives("floor ceil round sign rem nextafter argmax argmin".split())
COMPARISONS = primitives("lt le gt ge eq ne".split())
EQUALITIES = primitives(["eq", "ne"])
LOGIC = primitives(["and", "or", "not", "xor"])
IS_FINITE, SELECT_N, CONVERT_ELEMENT_TYPE = (
    primitive(n) for n in ("is_finite", "select_n", "convert_element_type"))
#: primitives whose derivative is zero (`genvi.adev.variance_training`)
ZERO_DERIVATIVE = primitives(["stop_gradient", "floor", "ceil", "round", "sign"])
#: the primitives that keep a sum a sum (`genvi.inference.enumeration.evaluate`): adding,
#: subtracting, negating, scaling by a constant, and those that pass a scalar on
ADD, SUB, NEG, SCALE, DIV = (primitives(names) for names in (
    ["add", "add_any"], ["sub"], ["neg"], ["mul", "div"], ["div"]))
TO_SCALAR = primitives(["convert_element_type", "copy", "reduce_sum", "reshape",
                        "broadcast_in_dim", "squeeze"])
#: reorderings of a scan's stacked inputs on their way in (`...enumeration.chain`)
LAYOUT = primitives(["transpose", "convert_element_type"])


def structure_of(eqn: Any) -> Structure | None:
    """The structure of `eqn`'s primitive (None: not a structural primitive genvi knows:
    the evaluators then treat the equation as coupling the lanes)."""
    return STRUCTURE.get(eqn.primitive)
