"""`Expectation`: an objective program and its unbiased estimators.

`@gv.expectation` traces the function (with `gv.sample` sites and `g.sim` /
`g.log_density` calls) to a jaxpr; `jvp_estimate` runs the ADEV interpreter on it.
`estimate`, `grad_estimate` and `value_and_grad_estimate` are one jitted function
each: a `jax.custom_jvp` whose JVP rule *is* the forward estimator, differentiated
by `jax.grad` — JAX linearizes and transposes the estimator, so no strategy needs a
hand-written reverse rule. Expectations add, subtract and scale; `batch_mean` maps
an objective over a minibatch inside the estimator (a plate), so JAX transposes one
batched linear map instead of materializing per-example gradients.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from genvi.adev.dual import Dual
from genvi.adev import dual as d
from genvi.adev import smoothness
from genvi.adev.explain import explain
from genvi.adev.interpreter import estimate_jvp
from genvi.core.mistakes import arg_names, check_key
from genvi.core.tracing import IN_OBJECTIVE, merge_args, split_args, trace_cached
from genvi.core.validation import entry_point


class Expectation:
    """An expected value whose estimators genvi derives. Maximize it.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(p):
        ...     b = gv.sample(gv.flip(p, grad=gv.ENUM))
        ...     return jax.numpy.where(b, 1.0, 3.0)
        >>> key = jax.random.key(0)
        >>> float(e.estimate(key, 0.25)), float(e.grad_estimate(key, 0.25))
        (2.5, -2.0)
    """

    def __init__(self) -> None:
        self._jitted: dict = {}

    # Subclasses define the forward-mode estimator on flat dynamic leaves.
    def _jvp(self, key: Any, args: tuple, targs: tuple | None) -> Dual:
        raise NotImplementedError

    # -- public API -------------------------------------------------------------
    @entry_point
    def jvp_estimate(self, key: jax.Array, primals: tuple, tangents: tuple) -> tuple:
        """Forward-mode estimator: `(value, directional derivative)` estimates.

        `tangents` has the structure of `primals`; use `None` for no tangent.
        """
        check_key(key, f"{self._label}.jvp_estimate")
        out = self._jvp(key, tuple(primals), tuple(tangents))
        t = out.tangent if out.tangent is not None else jnp.zeros_like(out.primal)
        return out.primal, t

    @entry_point
    def estimate(self, key: jax.Array, *args: Any) -> jax.Array:
        """An unbiased estimate of the expected value.

        `jax.grad`, `jax.jvp` and `jax.vjp` of it are genvi's unbiased estimators (its
        derivative rule is the ADEV estimator), so `jax.grad(obj.estimate, 1)(key, p)`
        equals `obj.grad_estimate(key, p)`; prefer the latter, which also returns
        gradients for every pytree argument you name in `argnums`."""
        check_key(key, f"{self._label}.estimate")
        return self._compiled("estimate", None)(key, *args)

    @entry_point
    def grad_estimate(self, key: jax.Array, *args: Any, argnums: int | Sequence[int] = 0) -> Any:
        """An unbiased estimate of the gradient with respect to `args[argnums]`
        (a pytree like that argument; a tuple of them when `argnums` is a tuple).

        Where the estimate of the value is not finite (a NaN from invalid parameters,
        say), every entry of the gradient is NaN: a finite gradient of a NaN objective
        is meaningless, and returning it would hide the NaN."""
        check_key(key, f"{self._label}.grad_estimate")
        return self._value_and_grad("poisoned grad", key, args, argnums)[1]

    @entry_point
    def value_and_grad_estimate(self, key: jax.Array, *args: Any,
                                argnums: int | Sequence[int] = 0) -> tuple:
        """`(estimate, gradient estimate)` from one run of the estimator."""
        check_key(key, f"{self._label}.value_and_grad_estimate")
        return self._value_and_grad("grad", key, args, argnums)

    def _value_and_grad(self, what: str, key: Any, args: tuple, argnums: Any) -> tuple:
        nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        try:
            value, grads = self._compiled(what, nums)(key, *args)
        except TypeError:
            # JAX's dtype error names no leaf; look only once it failed (no cost otherwise)
            bad = [(f"args[{i}]{path}", dt) for i in nums for path, dt in non_float_leaves(args[i])]
            if not bad:
                raise
            raise TypeError(
                "value_and_grad_estimate differentiates only floating-point leaves; these are "
                f"not: {', '.join(f'{p} ({dt})' for p, dt in bad)}. Use floats (e.g. 0.0 "
                "instead of 0), or pass integer values in an argument outside argnums"
            ) from None
        return value, grads[0] if isinstance(argnums, int) else grads

    @property
    def _label(self) -> str:  # for error messages
        return getattr(self, "name", "objective")

    # -- composition --------------------------------------------------------------
    def __add__(self, other: "Expectation") -> "Expectation":
        return _Sum(self, other, 1.0)

    def __sub__(self, other: "Expectation") -> "Expectation":
        return _Sum(self, other, -1.0)

    def __mul__(self, c: float) -> "Expectation":
        return _Scaled(self, c)

    __rmul__ = __mul__

    def __neg__(self) -> "Expectation":
        return _Scaled(self, -1.0)

    # -- machinery ------------------------------------------------------------------
    def _value_fn(self, key: Any, args: tuple) -> Callable:
        """`args -> value` as a custom_jvp whose JVP rule is the ADEV estimator."""
        dyn, static, treedef, mask = split_args(args)

        @jax.custom_jvp
        def value(key, dyn):
            return self._jvp(key, merge_args(list(dyn), static, treedef, mask), None).primal

        def rule(primals, tangents):
            key, dyn = primals
            tdyn = [None if isinstance(t, SymbolicZero) else t for t in tangents[1]]
            if all(t is None for t in tdyn):
                tangent = None
                out = self._jvp(key, merge_args(list(dyn), static, treedef, mask), None)
            else:
                targs = merge_args(tdyn, [None] * len(static), treedef, mask)
                out = self._jvp(key, merge_args(list(dyn), static, treedef, mask), targs)
                tangent = out.tangent
            if tangent is None:
                tangent = jnp.zeros_like(out.primal)
            return out.primal, tangent

        value.defjvp(rule, symbolic_zeros=True)
        return lambda new_dyn: value(key, list(new_dyn))

    def _compiled(self, what: str, argnums: tuple | None) -> Callable:
        cache_key = (what, argnums)
        fn = self._jitted.get(cache_key)
        if fn is None:
            if what == "estimate":
                # the same custom_jvp as the gradient's: `jax.grad` / `jax.jvp` of
                # `estimate` differentiate by the ADEV estimator, never pathwise
                def fn(key, *args):
                    return self._value_fn(key, args)(split_args(args)[0])
            else:
                def fn(key, *args):
                    value, grads = self._value_and_grad_uncached(key, args, argnums)
                    if what == "poisoned grad":
                        grads = jax.tree.map(lambda g: jnp.where(jnp.isfinite(value), g, jnp.nan), grads)
                    return value, grads
            fn = self._jitted[cache_key] = jax.jit(fn)
        return fn

    def _value_and_grad_uncached(self, key: Any, args: tuple, argnums: tuple) -> tuple:
        """Trace the estimator: `(value, gradients wrt args[argnums])` (a tuple)."""
        diff = tuple(args[i] for i in argnums)

        def f(diff):
            full = list(args)
            for i, v in zip(argnums, diff):
                full[i] = v
            return self._value_fn(key, tuple(full))(split_args(tuple(full))[0])

        return jax.value_and_grad(f)(diff)

    def explain(self, *args: Any, key: jax.Array | None = None,
                argnums: int | Sequence[int] = 0) -> Any:
        """What the gradient estimator does at each site and what it costs: address,
        distribution, strategy, the plates/scans around it and its lanes, how its
        replays are evaluated (none, lane-local, whole-objective, enumeration), and
        the compiled value and gradient steps' FLOPs. `print` the result.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.expectation
            ... def coin(p):
            ...     b = gv.sample(gv.flip(p, grad=gv.MVD), name="b")
            ...     return jax.numpy.where(b, 1.0, 3.0)
            >>> print(coin.explain(0.25).sites[0]["replays"])
            1 × 1 lane: whole-objective replays
        """
        nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        return explain(self, jax.random.key(0) if key is None else key, args, nums)


class ProgramExpectation(Expectation):
    """An expectation defined by a Python function (see `gv.expectation`)."""

    def __init__(self, fn: Callable, name: str | None = None,
                 requires: Callable[..., None] | None = None):
        super().__init__()
        self.fn = fn
        # `requires(*args)` raises when the strategies it is given make the objective's
        # gradient estimator biased (checked when differentiating, like smoothness)
        self.requires = requires
        self.name = name or getattr(fn, "__name__", "expectation")
        self._traces: dict = {}
        self._checked: set = set()  # (trace, differentiated inputs) that passed the check
        functools.update_wrapper(self, fn, updated=())

    def trace(self, *args: Any):
        """The traced objective: `(closed jaxpr, dynamic argument leaves)`."""
        traced, dyn = trace_cached(self._traces, self.fn, args, IN_OBJECTIVE.set,
                                   name=("objective", self.name, self.fn))
        out = traced.closed.jaxpr.outvars
        if len(out) != 1 or out[0].aval.shape != () or not jnp.issubdtype(out[0].aval.dtype, jnp.floating):
            raise TypeError(f"the objective {self.name!r} must return one float scalar; "
                            f"it returned {[v.aval.str_short() for v in out]}")
        return traced.closed, dyn

    def __call__(self, *args: Any) -> jax.Array:
        """Inside another objective program, the value of this one (its program is
        inlined, so its sampling sites become part of the caller's estimator).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.expectation
            ... def square(mu):
            ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
            ...     return x * x
            >>> @gv.expectation
            ... def shifted(mu):                    # E[(mu + 1 + eps)^2] = (mu + 1)^2 + 1
            ...     return square(mu + 1.0)
            >>> g = shifted.grad_estimate(jax.random.key(0), 0.5)   # unbiased for 2 (mu + 1)
        """
        if not IN_OBJECTIVE:
            raise TypeError(f"the objective {self.name!r} was called outside an objective "
                            "program; use .estimate(key, *args) for its value")
        return self.fn(*args)

    def _jvp(self, key, args, targs):
        closed, dyn = self.trace(*args)
        if targs is None:
            tdyn = [None] * len(dyn)
        else:
            _, _, treedef, mask = split_args(args)
            tleaves = treedef.flatten_up_to(targs)
            tdyn = [t for t, m in zip(tleaves, mask) if m]
            tdyn = [None if (t is None or not jnp.issubdtype(jnp.result_type(p), jnp.inexact)) else t
                    for t, p in zip(tdyn, dyn)]
            differentiated = tuple(t is not None for t in tdyn)
            if (id(closed), differentiated) not in self._checked:  # once per trace and mask
                if any(differentiated) and self.requires is not None:
                    self.requires(*args)
                smoothness.check(closed, differentiated)
                self._checked.add((id(closed), differentiated))
        return estimate_jvp(closed, key, dyn, tdyn)

    def __repr__(self) -> str:
        return f"<gv.expectation {self.name}>"


class _Sum(Expectation):
    def __init__(self, a: Expectation, b: Expectation, sign: float):
        super().__init__()
        self.a, self.b, self.sign = a, b, sign
        self.name = f"{a._label} {'+' if sign > 0 else '-'} {b._label}"

    def _jvp(self, key, args, targs):
        ka, kb = jax.random.split(key)
        x, y = self.a._jvp(ka, args, targs), self.b._jvp(kb, args, targs)
        return Dual(x.primal + self.sign * y.primal, d.add(x.tangent, d.mul(self.sign, y.tangent)))


class _Scaled(Expectation):
    def __init__(self, inner: Expectation, c: float):
        super().__init__()
        self.inner, self.c = inner, c
        self.name = f"{c} * {inner._label}"

    def _jvp(self, key, args, targs):
        x = self.inner._jvp(key, args, targs)
        return Dual(self.c * x.primal, d.mul(self.c, x.tangent))


class _BatchMean(Expectation):
    def __init__(self, inner: Expectation, in_axes: Any):
        super().__init__()
        self.inner, self.in_axes = inner, in_axes
        self.name = f"batch_mean({inner._label})"

    def _jvp(self, key, args, targs):
        in_axes = self.in_axes if isinstance(self.in_axes, (tuple, list)) else (self.in_axes,) * len(args)
        in_axes = tuple(in_axes) + (None,) * (len(args) - len(in_axes))
        sizes = _batch_sizes(self.inner, args, in_axes)
        if not sizes:
            raise ValueError("gv.batch_mean: in_axes maps no argument")
        keys = jax.random.split(key, sizes[0])
        targs = targs if targs is not None else (None,) * len(args)
        t_axes = tuple(None if t is None else ax for t, ax in zip(targs, in_axes))

        def one(k, a, t):
            out = self.inner._jvp(k, tuple(a), None if all(x is None for x in t) else tuple(t))
            return out.primal, out.tangent

        primal, tangent = jax.vmap(one, in_axes=(0, in_axes, t_axes))(keys, tuple(args), tuple(targs))
        return Dual(jnp.mean(primal), None if tangent is None else jnp.mean(tangent))


def _batch_sizes(inner: Expectation, args: tuple, in_axes: tuple) -> list:
    """The size of the mapped axis of each mapped leaf; a ValueError naming the
    argument when a leaf has no such axis (a Python list, a scalar). An argument's
    axis may be a pytree prefix of it, as in `jax.vmap` (`{"w": None, "b": 0}`)."""
    names = arg_names(getattr(inner, "fn", None)) or []
    sizes = []

    def check(ax, part, label, a):
        if ax is None:
            return
        for leaf in jax.tree_util.tree_leaves(part):
            shape = jnp.shape(leaf)
            if not -len(shape) <= ax < len(shape):
                what = ("a Python list" if isinstance(a, list) else
                        f"a value of shape {shape}")
                fix = ("convert it with jnp.asarray(...)" if isinstance(a, list) else
                       "pass an array whose leading axis indexes the datapoints, or map "
                       "it with None in in_axes")
                raise ValueError(
                    f"gv.batch_mean: {label} of the objective is mapped over axis {ax} "
                    f"(in_axes), but it is {what}, which has no axis {ax}. A minibatch is an "
                    f"array with a leading batch axis: {fix}.")
            sizes.append(shape[ax])

    for i, (a, ax) in enumerate(zip(args, in_axes)):
        label = f"argument {i}" + (f" ({names[i]})" if i < len(names) else "")
        try:
            jax.tree_util.tree_map(lambda x, part: check(x, part, label, a), ax, a,
                                   is_leaf=lambda x: x is None)
        except ValueError as err:
            if str(err).startswith("gv.batch_mean"):
                raise
            raise ValueError(f"gv.batch_mean: in_axes for {label} is {ax!r}, which is not a "
                             f"prefix of the argument's structure "
                             f"{jax.tree_util.tree_structure(a)}: give one axis (or None) "
                             "for the whole argument, or a tree of axes shaped like it") from None
    if len(set(sizes)) > 1:
        raise ValueError(f"gv.batch_mean: the mapped axes have different sizes {sizes}; "
                         "every mapped argument needs the same batch size")
    return sizes


def expectation(fn: Callable) -> ProgramExpectation:
    """Decorate an objective program; returns an `Expectation`.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(mu):
        ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        ...     return x * x
        >>> g = e.grad_estimate(jax.random.key(1), 0.5)   # unbiased for 2 * mu
    """
    return ProgramExpectation(fn)


def batch_mean(obj: Expectation, in_axes: Any = (None, 0)) -> Expectation:
    """The mean over a mapped axis of independent per-datapoint estimates of `obj`.

    Each datapoint's REINFORCE/MVD/ENUM terms see only its own datapoint (a plate);
    the estimator is vmapped inside the differentiated function, so the gradient
    costs what a hand-written batched gradient costs.

    Example:
        >>> import genvi as gv
        >>> # objective(params, x) over a batch xs of shape (B, ...):
        >>> # gv.batch_mean(objective, in_axes=(None, 0)).grad_estimate(key, params, xs)
    """
    return _BatchMean(obj, in_axes)


def non_float_leaves(tree: Any) -> list[tuple[str, str]]:
    """`(pytree path, dtype)` of each leaf that is not floating point (or complex):
    such leaves cannot be differentiated or trained.

    Example:
        >>> from genvi.adev.expectation import non_float_leaves
        >>> non_float_leaves({"m": 0.0, "n": 1})
        [("['n']", 'int32')]
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    dtypes = [(jax.tree_util.keystr(path), jnp.result_type(x)) for path, x in leaves]
    return [(path, str(dt)) for path, dt in dtypes if not jnp.issubdtype(dt, jnp.inexact)]
