"""`Expectation`: an expected value and its unbiased estimators, and its algebra.

`estimate`, `grad_estimate` and `value_and_grad_estimate` are one jitted function
each: a `jax.custom_jvp` whose JVP rule *is* the forward estimator (`dual_estimate`),
differentiated by `jax.grad` — JAX linearizes and transposes the estimator, so no
strategy needs a hand-written reverse rule. Objective programs (`@gv.expectation`)
are in `genvi.adev.program`, minibatches (`gv.batch_mean`) in `genvi.adev.batch_mean`.

Expectations combine: `e + c`, `c + e`, `e - c`, `c - e`, `e / c`, `c * e`, `e1 + e2`,
`e1 - e2`, `e1 * e2` (independent estimates), `e ** n`, `gv.exp(e)` and
`gv.average(e, n)` (the estimators are in `genvi.adev.algebra`); any nonlinear use of
an `Expectation` object (`jnp.exp(e)`, `float(e)`, `e / e2`) is refused with what it
would mean and what to write instead.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from genvi.adev import algebra
from genvi.adev import dual as d
from genvi.adev.dual import Dual
from genvi.adev.explain import explain
from genvi.core.draws import bind_draw
from genvi.core.keywords import takes_keywords
from genvi.core.mistakes import check_key
from genvi.core.tracing import IN_OBJECTIVE, as_constants, merge_args, split_args
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

    def dual_estimate(self, key: Any, args: tuple, targs: tuple | None) -> Dual:
        """The extension point: the forward-mode estimator, `Dual(value estimate,
        directional-derivative estimate)` at `args` in direction `targs` (None: no
        tangent at all; a `None` leaf: none for that argument). A subclass that
        defines it, unbiased for the value and linear in `targs`, gets `estimate`,
        `grad_estimate`, `value_and_grad_estimate`, `jvp_estimate`, `explain` and
        the expectation algebra from this class: JAX linearizes and transposes it.

        Example:
            >>> import genvi as gv, jax, jax.numpy as jnp
            >>> class Square(gv.Expectation):     # E[x²] = x² (no randomness)
            ...     def dual_estimate(self, key, args, targs):
            ...         (x,) = args
            ...         t = None if targs is None or targs[0] is None else 2 * x * targs[0]
            ...         return gv.dual.Dual(x ** 2, t)
            >>> float(Square().grad_estimate(jax.random.key(0), 3.0))
            6.0
        """
        raise NotImplementedError

    def __call__(self, *args: Any) -> jax.Array:
        """Inside an objective program, one draw of this expectation's estimator at
        `args`: unbiased for its value, with an unbiased derivative, and independent
        of every other call (`genvi.core.draws`). So `gv.exp(inner)(theta)` inside an
        outer expectation over theta estimates E_θ[exp(E[inner](θ))] without bias.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.expectation
            ... def x(mu):
            ...     return gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
            >>> squared = x * x                       # E[x]², from two independent draws
            >>> @gv.expectation
            ... def outer(mu):
            ...     return squared(mu) - 1.0
            >>> g = outer.grad_estimate(jax.random.key(0), 2.0)   # unbiased for 2·2 = 4
        """
        if not IN_OBJECTIVE:
            raise TypeError(f"the expectation {self._label!r} was called outside an objective "
                            "program; use .estimate(key, *args) for its value")
        return bind_draw(self, args)

    # -- public API -------------------------------------------------------------
    @entry_point
    def jvp_estimate(self, key: jax.Array, primals: tuple, tangents: tuple) -> tuple:
        """Forward-mode estimator: `(value, directional derivative)` estimates.

        `tangents` has the structure of `primals`; use `None` for no tangent.
        """
        check_key(key, f"{self._label}.jvp_estimate")
        out = self.dual_estimate(key, tuple(primals), tuple(tangents))
        t = out.tangent if out.tangent is not None else jnp.zeros_like(out.primal)
        return out.primal, t

    @entry_point
    @takes_keywords
    def estimate(self, key: jax.Array, *args: Any) -> jax.Array:
        """An unbiased estimate of the expected value.

        `jax.grad`, `jax.jvp` and `jax.vjp` of it are genvi's unbiased estimators (its
        derivative rule is the ADEV estimator), so `jax.grad(obj.estimate, 1)(key, p)`
        equals `obj.grad_estimate(key, p)`; prefer the latter, which also returns
        gradients for every pytree argument you name in `argnums`."""
        check_key(key, f"{self._label}.estimate")
        return self._compiled("estimate", None)(key, *as_constants(args))

    @entry_point
    @takes_keywords
    def grad_estimate(self, key: jax.Array, *args: Any, argnums: int | Sequence[int] = 0) -> Any:
        """An unbiased estimate of the gradient with respect to `args[argnums]`
        (a pytree like that argument; a tuple of them when `argnums` is a tuple).

        Where the estimate of the value is not finite (a NaN from invalid parameters,
        say), every entry of the gradient is NaN: a finite gradient of a NaN objective
        is meaningless, and returning it would hide the NaN."""
        check_key(key, f"{self._label}.grad_estimate")
        return self._value_and_grad("poisoned grad", key, args, argnums)[1]

    @entry_point
    @takes_keywords
    def value_and_grad_estimate(self, key: jax.Array, *args: Any,
                                argnums: int | Sequence[int] = 0) -> tuple:
        """`(estimate, gradient estimate)` from one run of the estimator."""
        check_key(key, f"{self._label}.value_and_grad_estimate")
        return self._value_and_grad("grad", key, args, argnums)

    def _value_and_grad(self, what: str, key: Any, args: tuple, argnums: Any) -> tuple:
        nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        try:
            # Python ints outside argnums are constants; inside, JAX refuses them below
            fixed = tuple(a if i in nums else as_constants(a) for i, a in enumerate(args))
            value, grads = self._compiled(what, nums)(key, *fixed)
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

    # -- the algebra (genvi.adev.algebra); anything nonlinear is refused ----------
    def __add__(self, other: Any) -> "Expectation":
        if isinstance(other, Expectation):
            return _Sum(self, other, 1.0)
        return Composed(f"{self._label} + {_constant(other, 'e + c')}",
                         algebra.affine(self.dual_estimate, 1.0, other))

    def __radd__(self, other: Any) -> "Expectation":
        return Composed(f"{_constant(other, 'c + e')} + {self._label}",
                         algebra.affine(self.dual_estimate, 1.0, other))

    def __sub__(self, other: Any) -> "Expectation":
        if isinstance(other, Expectation):
            return _Sum(self, other, -1.0)
        return Composed(f"{self._label} - {_constant(other, 'e - c')}",
                         algebra.affine(self.dual_estimate, 1.0, -other))

    def __rsub__(self, other: Any) -> "Expectation":
        return Composed(f"{_constant(other, 'c - e')} - {self._label}",
                         algebra.affine(self.dual_estimate, -1.0, other))

    def __mul__(self, other: Any) -> "Expectation":
        if isinstance(other, Expectation):
            return Composed(f"({self._label}) * ({other._label})",
                             algebra.product([self.dual_estimate, other.dual_estimate]))
        return self._scaled(_constant(other, "c * e"))

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> "Expectation":
        if isinstance(other, Expectation):
            raise _nonlinear(f"{self._label} / {other._label}", "E[e1] / E[e2]",
                             "there is no unbiased estimator of a ratio of expectations; "
                             "write the objective so that it is a product or a sum "
                             "(e.g. e1 * e2 with e2 estimating 1 / E[...] by other means)")
        return self._scaled(1.0 / _constant(other, "e / c"))

    def __rtruediv__(self, other: Any) -> "Expectation":
        raise _nonlinear(f"c / {self._label}", "c / E[e]",
                         "there is no unbiased estimator of a reciprocal of an expectation")

    def __pow__(self, n: Any) -> "Expectation":
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise _nonlinear(f"{self._label} ** {n!r}", f"E[e] ** {n!r}",
                             "only a positive integer power has an unbiased estimator (a "
                             "product of independent estimates): e ** 2, e ** 3, ...")
        return self if n == 1 else Composed(f"({self._label}) ** {int(n)}",
                                             algebra.power(self.dual_estimate, int(n)))

    def __rpow__(self, other: Any) -> "Expectation":
        raise _nonlinear(f"c ** {self._label}", "c ** E[e] = exp(E[e] log c)",
                         "write gv.exp(e * math.log(c))")

    def __neg__(self) -> "Expectation":
        return self._scaled(-1.0)

    def _scaled(self, c: Any) -> "Expectation":
        return Composed(f"{c} * {self._label}", algebra.affine(self.dual_estimate, c))

    def _nonlinear_use(self, *_: Any, kind: type = TypeError) -> Any:
        raise _nonlinear(f"f({self._label})", "f(E[e]) for a nonlinear f (jnp.exp, jnp.log, "
                         "float, a comparison, ...)",
                         "gv.exp(e) estimates exp(E[e]) without bias; there is no unbiased "
                         "estimator of log E[e] (IWELBO-style bounds, gv.iwelbo, estimate it "
                         "from below)", kind)

    # JAX looks `__jax_array__` up first (jnp.exp, jnp.log, jnp.asarray). Its jitted
    # functions replace any TypeError raised there by their own message (`from None`),
    # so this one is a ValueError: the only way our words reach the user
    __jax_array__ = property(lambda self: self._nonlinear_use(kind=ValueError))
    # (truthiness stays an object's: `report or objective` is a choice of objects)
    __array__ = __float__ = __int__ = __complex__ = __index__ = _nonlinear_use
    __abs__ = __lt__ = __le__ = __gt__ = __ge__ = __round__ = _nonlinear_use

    # -- machinery ------------------------------------------------------------------
    def _value_fn(self, key: Any, args: tuple) -> Callable:
        """`args -> value` as a custom_jvp whose JVP rule is the ADEV estimator."""
        dyn, static, treedef, mask = split_args(args)

        @jax.custom_jvp
        def value(key, dyn):
            return self.dual_estimate(key, merge_args(list(dyn), static, treedef, mask), None).primal

        def rule(primals, tangents):
            key, dyn = primals
            tdyn = [None if isinstance(t, SymbolicZero) else t for t in tangents[1]]
            if all(t is None for t in tdyn):
                tangent = None
                out = self.dual_estimate(key, merge_args(list(dyn), static, treedef, mask), None)
            else:
                targs = merge_args(tdyn, [None] * len(static), treedef, mask)
                out = self.dual_estimate(key, merge_args(list(dyn), static, treedef, mask), targs)
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

    @takes_keywords
    def explain(self, *args: Any, key: jax.Array | None = None,
                argnums: int | Sequence[int] = 0) -> Any:
        """What the gradient estimator does at each site and what it costs: address,
        distribution, strategy, the plates/scans around it and its lanes, how its
        replays are evaluated (none, lane-local, whole-objective, enumeration), and
        the compiled value and gradient steps' costs (compiled when first read, so
        reading only `sites` compiles nothing). `print` the result.

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


class Composed(Expectation):
    """An expectation built by the algebra from others (`genvi.adev.algebra`): its
    label and its dual estimator."""

    def __init__(self, name: str, estimator: algebra.Estimator):
        super().__init__()
        self.name, self._estimator = name, estimator

    def dual_estimate(self, key, args, targs):
        return self._estimator(key, args, targs)


class _Sum(Expectation):
    def __init__(self, a: Expectation, b: Expectation, sign: float):
        super().__init__()
        self.a, self.b, self.sign = a, b, sign
        self.name = f"{a._label} {'+' if sign > 0 else '-'} {b._label}"

    def dual_estimate(self, key, args, targs):
        ka, kb = jax.random.split(key)
        x, y = self.a.dual_estimate(ka, args, targs), self.b.dual_estimate(kb, args, targs)
        return Dual(x.primal + self.sign * y.primal, d.add(x.tangent, d.mul(self.sign, y.tangent)))


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


def _constant(c: Any, form: str) -> Any:
    """`c` if it is a real constant (a Python or NumPy number, a 0-d real array), else
    a TypeError naming the expression `form`."""
    if isinstance(c, Expectation):
        raise TypeError(f"{form}: both sides are expectations here; this form takes a constant")
    real = (isinstance(c, (int, float, np.integer, np.floating)) and not isinstance(c, bool)) or (
        isinstance(c, (np.ndarray, jax.Array)) and np.shape(c) == ()
        and (jnp.issubdtype(jnp.result_type(c), jnp.floating)
             or jnp.issubdtype(jnp.result_type(c), jnp.integer)))
    if not real:
        raise TypeError(
            f"{form} with c = {c!r} ({type(c).__name__}): an expectation combines with real "
            "constants (Python or NumPy numbers, 0-d real arrays) and with other "
            "expectations (e1 + e2, e1 * e2); for anything else write an objective program "
            "that calls e(*args) for a draw of its integrand.")
    return c


def _nonlinear(expression: str, meaning: str, instead: str,
               kind: type = TypeError) -> Exception:
    return kind(
        f"{expression} would mean {meaning}, a nonlinear function of an expected value, "
        f"which genvi cannot estimate by applying it to one estimate (Jensen's gap): "
        f"{instead}. The expectation algebra is e + c, c + e, e - c, c - e, e / c, c * e, "
        "e1 + e2, e1 - e2, e1 * e2, e ** n (positive int n), gv.exp(e, rate, shift) and "
        "gv.average(e, n); inside an objective program, e(*args) is one draw of e's "
        "integrand (so jnp.exp(e(*args)) there estimates E[exp f], not exp E[f]).")
