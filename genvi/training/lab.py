"""`gv.compare_estimators`: an estimator lab.

Given one objective built with several gradient-strategy choices, measure for each
parameter leaf: the variance of the gradient estimator (over many independent keys,
one jitted `lax.scan` over `vmap`ped chunks of keys, so memory stays at one chunk of
gradients), the seconds per estimate (warm, jitted `grad_estimate`, interleaved across
estimators, median), their product (work-normalized variance: the variance of an
average of estimates computed in one second, up to a constant) and whether the means
agree (z-scores against an exact gradient, or between the estimators).

It lives beside `gv.fit` because it is a tool one runs on compiled estimators before
training (to pick strategies), using only the public `Expectation` API and the
package's timing helpers.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from genvi.adev.expectation import Expectation
from genvi.core.mistakes import arg_names, check_key
from genvi.core.tracing import merge_args, split_args
from genvi.training.comparison import EstimatorComparison, z_threshold
from genvi.training.timing import interleaved_samples, median

def _leaf_names(tree: Any, argnums: Any, names: list | None) -> list[str]:
    """"guide/rnn/kernel"-style names of the gradient's leaves."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        if not isinstance(argnums, int):  # the first key indexes argnums
            keys[0] = _arg_label(nums[int(keys[0])], names)
        elif not keys:
            keys = [_arg_label(argnums, names)]
        out.append("/".join(keys))
    return out


def _arg_label(i: int, names: list | None) -> str:
    return names[i] if names and i < len(names) else f"args[{i}]"


def _moments(grad: Callable, keys: jax.Array, samples: int, batch: int) -> Callable:
    """`dyn -> (mean, variance)` lists per leaf of `grad(key, dyn)` over `keys`: a
    `lax.scan` over chunks of `batch` keys, each `vmap`ped (one copy of the estimator
    in the program), merging each chunk's mean and centred sum of squares into the
    running ones (Chan et al.'s pairwise update: no float32 cancellation)."""
    chunks = -(-samples // batch)
    pad = chunks * batch - samples
    keys = jnp.concatenate([keys, keys[:pad]]) if pad else keys
    keys = keys.reshape((chunks, batch) + keys.shape[1:])
    weights = (jnp.arange(chunks * batch) < samples).astype(jnp.float32).reshape(chunks, batch)

    def run(dyn):
        many = jax.vmap(lambda k: grad(k, dyn))

        def step(carry, xs):
            n, means, m2s = carry
            w = xs[1]
            nb = jnp.sum(w)
            total = n + nb
            out_means, out_m2s = [], []
            for g, mean, m2 in zip(many(xs[0]), means, m2s):
                wb = w.reshape((-1,) + (1,) * (g.ndim - 1))
                mb = jnp.sum(wb * g, 0) / nb
                m2b = jnp.sum(wb * jnp.square(g - mb), 0)
                delta = mb - mean
                out_means.append(mean + delta * (nb / total))
                out_m2s.append(m2 + m2b + jnp.square(delta) * (n * nb / total))
            return (total, out_means, out_m2s), None

        shapes = jax.eval_shape(lambda k: grad(k, dyn), keys[0, 0])
        zeros = [jnp.zeros(x.shape, x.dtype) for x in shapes]
        (_, mean, m2), _ = jax.lax.scan(step, (jnp.zeros(()), zeros, zeros), (keys, weights))
        return mean, [v / (samples - 1) for v in m2]

    return run


def _z(m1, s1, m2, s2) -> float:
    """max over entries of |m1 − m2| / sqrt(s1² + s2²), with a float32 rounding floor
    so that two exact (zero-variance) estimators that agree give 0, not 0/0."""
    m1, m2 = np.asarray(m1, np.float64), np.asarray(m2, np.float64)
    floor = 1e-5 * (np.abs(m1) + np.abs(m2)) + 1e-30
    z = np.abs(m1 - m2) / np.sqrt(np.square(s1) + np.square(s2) + np.square(floor))
    return float(np.max(z)) if z.size else 0.0


def compare_estimators(estimators: Mapping[str, Any], key: jax.Array, *args: Any,
                       make: Callable[[Any], Expectation] | None = None,
                       argnums: int | Sequence[int] = 0, samples: int = 1000,
                       rounds: int = 20, exact: Any = None,
                       leaves: Sequence[str] | None = None, batch: int | None = None,
                       figure: str | None = None) -> EstimatorComparison:
    """Measure the gradient estimators of one objective built several ways.

    `estimators` maps a label to an objective (`gv.Expectation`), or, with `make`,
    to a strategy choice that `make(choice)` turns into one (a strategy such as
    `gv.MVD`, a dict of address → strategy: `make` decides). Every objective is
    differentiated with respect to `args[argnums]` at the same `args`.

    For each estimator and gradient leaf: mean and variance over `samples`
    independent estimates (keys `jax.random.split(key, samples)`, `batch` per
    `vmap`, by default as many as keep about 2²² gradient entries in memory, all
    under one `jax.jit`); median seconds per jitted `grad_estimate`
    (warm, interleaved across estimators over `rounds` rounds); variance × seconds;
    and a bias check: z-scores of the means against `exact` (a pytree like the
    gradient, e.g. a gradient known in closed form or by enumeration) or, without
    it, between the estimators. `leaves` keeps only leaves whose "a/b/c" names start
    with one of the given prefixes. With `figure`, the plot is saved there too.

    Args:
        estimators: label → objective, or label → a choice that `make` turns into one.
        key: the randomness of every estimate.
        *args: the objectives' arguments.
        make: a function building an objective from a choice (optional).
        argnums: which of `args` the gradient is taken in.
        samples: independent estimates per estimator.
        rounds: interleaved timing rounds.
        exact: the exact gradient, for the bias check (optional).
        leaves: prefixes of the gradient leaves to keep (optional).
        batch: estimates per `vmap` (optional).
        figure: a path to save the plot to (optional).

    Returns:
        an `EstimatorComparison`: `.table()`, `.plot()`, and the numbers per estimator
        and leaf.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> def make(strategy):
        ...     @gv.expectation
        ...     def e(p):                       # d/dp E[(b - 0.2)²] = 0.64 - 0.04 = 0.6
        ...         b = gv.sample(gv.flip(p, grad=strategy))
        ...         return (jnp.where(b, 1.0, 0.0) - 0.2) ** 2
        ...     return e
        >>> lab = gv.compare_estimators({"REINFORCE": gv.REINFORCE, "MVD": gv.MVD}, jax.random.key(0),
        ...                             0.3, make=make, samples=2000, rounds=3, exact=0.6)
        >>> lab.flagged, lab.variance["MVD"]["p"] < lab.variance["REINFORCE"]["p"]
        ([], True)
    """
    check_key(key, "gv.compare_estimators")
    if not isinstance(estimators, Mapping) or not estimators:
        raise TypeError("gv.compare_estimators needs a non-empty mapping {label: objective} "
                        f"(or {{label: choice}} with make=); got {estimators!r}")
    objectives = {str(a): (make(c) if make is not None else c) for a, c in estimators.items()}
    for a, obj in objectives.items():
        if not isinstance(obj, Expectation):
            fix = "make(choice) must return one" if make is not None else \
                "pass objectives, or strategy choices with make=..."
            raise TypeError(f"gv.compare_estimators: estimator {a!r} is {obj!r}, not a "
                            f"gv.Expectation; {fix}")
    if samples < 2:
        raise ValueError(f"gv.compare_estimators: samples={samples}; a variance needs at least 2")
    dyn, static, treedef, mask = split_args(args)
    first = next(iter(objectives.values()))
    names = arg_names(getattr(first, "fn", None))

    def full_grad(obj: Expectation) -> Callable:
        return lambda k, d: obj.grad_estimate(k, *merge_args(list(d), static, treedef, mask),
                                              argnums=argnums)

    shape = jax.eval_shape(full_grad(first), key, dyn)
    all_names = _leaf_names(shape, argnums, names)
    keep = [i for i, f in enumerate(all_names)
            if leaves is None or any(f.startswith(p) for p in leaves)]
    if not keep:
        asked = "" if leaves is None else f" starts with {list(leaves)}"
        raise ValueError(f"gv.compare_estimators: no gradient leaf{asked}; the leaves are "
                         f"{all_names}")
    kept = [all_names[i] for i in keep]
    keys = jax.random.split(key, samples)
    if batch is None:  # about 2**22 gradient entries (16 MB of float32) per chunk
        flat_shapes = jax.tree_util.tree_leaves(shape)
        batch = 2 ** 22 // max(1, sum(math.prod(flat_shapes[i].shape) for i in keep))
    batch = max(1, min(batch, samples))

    mean, stderr, variance, timed = {}, {}, {}, {}
    for a, obj in objectives.items():
        g = full_grad(obj)
        flat = jax.eval_shape(g, key, dyn)
        if _leaf_names(flat, argnums, names) != all_names:
            raise ValueError(f"gv.compare_estimators: estimator {a!r}'s gradient has leaves "
                             f"{_leaf_names(flat, argnums, names)}, the first one's "
                             f"{all_names}; every objective must take the same arguments")
        m, v = jax.jit(_moments(_picked(g, keep), keys, samples, batch))(dyn)
        mean[a] = {f: np.asarray(x) for f, x in zip(kept, m)}
        stderr[a] = {f: np.sqrt(np.asarray(x) / samples) for f, x in zip(kept, v)}
        variance[a] = {f: float(np.sum(x)) for f, x in zip(kept, v)}
        timed[a] = functools.partial(jax.jit(g), key, dyn)

    seconds = _seconds(timed, rounds)
    threshold = {f: z_threshold(mean[next(iter(mean))][f].size) for f in kept}
    exact_leaves = None
    if exact is not None:
        ex = jax.tree_util.tree_leaves(exact)
        if len(ex) != len(all_names):
            raise ValueError(f"gv.compare_estimators: exact has {len(ex)} leaves; the gradient "
                             f"has {len(all_names)} ({all_names}); give it the gradient's structure")
        exact_leaves = {all_names[i]: np.asarray(ex[i], np.float64) for i in keep}
        max_z = {a: {f: _z(mean[a][f], stderr[a][f], exact_leaves[f], 0.0) for f in kept}
                 for a in objectives}
    else:
        max_z = {a: {f: _agreement(a, f, mean, stderr) for f in kept} for a in objectives}
    result = EstimatorComparison(tuple(objectives), tuple(kept), samples, mean, stderr, variance,
                                 seconds, max_z, threshold,
                                 "exact" if exact is not None else "others", exact_leaves)
    if figure is not None:
        result.plot(figure)
    return result


def _picked(grad: Callable, keep: list[int]) -> Callable:
    """`grad` returning only the leaves at the indices `keep`, as a list."""
    def picked(k, d):
        leaves = jax.tree_util.tree_leaves(grad(k, d))
        return [leaves[i] for i in keep]
    return picked


def _agreement(a: str, f: str, mean: dict, stderr: dict) -> float:
    """The lower median over the other estimators of the max |z| between a's mean and
    theirs: above the threshold only when a disagrees with more than half of them."""
    zs = sorted(_z(mean[a][f], stderr[a][f], mean[b][f], stderr[b][f]) for b in mean if b != a)
    return zs[(len(zs) - 1) // 2] if zs else 0.0


def _seconds(timed: dict, rounds: int) -> dict:
    """Median seconds per call, interleaved; each timed block lasts about 20 ms."""
    once = {}
    for a, fn in timed.items():
        jax.block_until_ready(fn())  # compile
        once[a] = median(interleaved_samples({a: fn}, rounds=3, reps=1)[a])
    reps = max(1, min(50, int(0.02 / max(min(once.values()), 1e-7))))
    samples = interleaved_samples(timed, rounds=max(rounds, 1), reps=reps, warmup=1)
    return {a: median(s) for a, s in samples.items()}
