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
all lanes). Which primitives a structure
holds is written here once; the names are turned into primitive objects here, where
JAX's modules are read (the fence), so a primitive JAX renames or drops is missed
here only, and a parameter JAX renames is read here only.

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
        convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1
        floor ge gt igamma igammac imag integer_pow is_finite le lgamma log log1p logistic
        lt max min mul ne neg nextafter not or polygamma pow real reduce_precision rem
        round rsqrt select_n sign sin sinh sqrt square stop_gradient sub tan tanh xor zeta
        bessel_i0e bessel_i1e shift_left shift_right_arithmetic shift_right_logical
        population_count random_gamma_grad""",
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


def primitives(names: Iterable[str]) -> frozenset:
    """The primitive objects of the given names that this JAX release defines.

    Args:
        names: primitive names, as JAX prints them in a jaxpr.

    Returns:
        A frozenset of `jax.extend.core.Primitive` (a name this release lacks is left out).

    Example:
        >>> import jax
        >>> primitives(["sin", "no_such_primitive"]) == frozenset({jax.lax.sin_p})
        True
    """
    return frozenset(_BY_NAME[n] for n in names if n in _BY_NAME)


#: primitive -> its structure: the one table both lane evaluators read
STRUCTURE: dict = {prim: structure for structure, names in _NAMES.items()
                   for prim in primitives(names.split())}

#: primitives some rules treat apart from the rest of their structure
REDUCE_SUM = _BY_NAME["reduce_sum"]
SORT = _BY_NAME["sort"]


def structure_of(eqn: Any) -> Structure | None:
    """The structure of `eqn`'s primitive (None: not a structural primitive genvi knows:
    the evaluators then treat the equation as coupling the lanes)."""
    return STRUCTURE.get(eqn.primitive)
