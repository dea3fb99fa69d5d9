"""genvi's primitives: what a traced program records at each random choice.

* `site_p`    – a sampling site `dist(...) @ "addr"` in a generative program.
* `observe_p` – `gv.observe(dist(...), value)` in a generative program.
* `sample_p`  – a sampling site inside an objective (`gv.sample`, or a site that
  `g.sim` turned into one); the ADEV interpreter gives it its gradient strategy.

Operands are the distribution's parameters followed by the strategy's dynamic
operands (e.g. a baseline value); the distribution, the static part of the strategy
and the address are static parameters. Under `jax.vmap` a site stays one site whose
parameters gain a leading axis (a product of independent components).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import jax

from genvi.core import jaxpr as jx
from genvi.core.draws import draw_p
from genvi.core.mistakes import is_shape_error, site_shape_error
from genvi.core.tracing import GENVI_CONDS, IN_OBJECTIVE
from genvi.core.walk import Hooks, env_of, walk


def _sample_aval(*avals, dist, n_params, addr=None, **_):
    params = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals[:n_params]]
    try:
        out = jax.eval_shape(lambda *p: dist.sample(jax.random.key(0), *p), *params)
    except (ValueError, TypeError) as err:  # name the site, not just the shapes
        if not is_shape_error(err):
            raise
        raise site_shape_error(dist, addr, [p.shape for p in params]) from err
    return jx.shaped(out.shape, out.dtype)


def _observe_aval(*avals, **_):
    return []


site_p = jx.make_primitive("genvi_site", _sample_aval)
observe_p = jx.make_primitive("genvi_observe", _observe_aval, multiple_results=True)
sample_p = jx.make_primitive("genvi_sample", _sample_aval)
# `gv.plate` markers (see `scaled_by`): no operands, no results
plate_p = jx.make_primitive("genvi_plate", _observe_aval, multiple_results=True)
def _site_event_ndims(*, dist, n_params, strategy=None, **_):
    params = tuple(dist.param_event_ndims) + (0,) * (n_params - len(dist.param_event_ndims))
    return params + (() if strategy is None else tuple(strategy.operand_event_ndims()))


def _site_unpadded(count, *, n_params, strategy=None, masked=False, **_):
    # the strategy's operands (after the parameters, before a mask) that are not
    # lane-shaped (`Strategy.lane_operands`)
    if strategy is None:
        return ()
    flags = strategy.lane_operands(count - n_params - int(masked))
    return tuple(n_params + i for i, lane in enumerate(flags) if not lane)


def _observe_event_ndims(*, dist, n_params, **_):
    return (dist.value_event_ndim,) + _site_event_ndims(dist=dist, n_params=n_params)


def _site_shared(*, dist, **_):
    # a distribution whose sample and density broadcast a leading axis of size 1
    # themselves may keep those parameters unbatched (`Distribution.lane_shared_params`)
    return getattr(dist, "lane_shared_params", ())


jx.register_batching_by_broadcasting(site_p, _site_event_ndims, _site_shared, _site_unpadded,
                                     "batch_axes")
jx.register_batching_by_broadcasting(sample_p, _site_event_ndims, _site_shared, _site_unpadded,
                                     "batch_axes")
jx.register_batching_by_broadcasting(observe_p, _observe_event_ndims)
jx.register_batching_by_broadcasting(plate_p)

SITES = frozenset({site_p, observe_p, plate_p})
SAMPLES = frozenset({sample_p})
MASKABLE = SITES | SAMPLES
#: what consumes a key in an objective: sampling sites and draws of expectations
RANDOMNESS = SAMPLES | {draw_p}


def bind_site(prim: Any, dist: Any, params: tuple, strategy: Any, addr: tuple | None,
              mask: Any = None, nest: tuple = (), batch_axes: int = 0,
              auxiliary: bool = False) -> Any:
    """Bind a sampling primitive for `dist(*params)` with `strategy` at `addr`.

    A `mask` (one boolean per lane) marks lanes where the site is not executed (an
    untaken branch of a batched `cond`): they are sampled but not scored. `batch_axes`:
    how many leading axes of the value are already lanes of `vmap` transformations (a site re-bound
    from a batched program's equation keeps its count). An `auxiliary` site is scored
    in its program's density but is not one of its choices (NumPyro's
    `infer={"is_auxiliary": True}`)."""
    static, operands = (None, ()) if strategy is None else strategy.split()
    extra = () if mask is None else (mask,)
    counted = {"batch_axes": batch_axes} if batch_axes else {}
    if auxiliary:
        counted["auxiliary"] = True
    return prim.bind(*params, *operands, *extra, dist=dist, strategy=static, addr=addr,
                     n_params=len(params), masked=mask is not None, nest=nest, **counted)


def bind_observe(dist: Any, value: Any, params: tuple, mask: Any = None,
                 addr: tuple | None = None, nest: tuple = (), missing: bool = False) -> None:
    """Bind an observation of `value` under `dist(*params)`; a named observation
    (`gv.observe(..., name=...)`) has an `addr` and its combinator `nest`, and is
    `missing` where its value was None (`value` is then a placeholder)."""
    extra = () if mask is None else (mask,)
    named = {} if addr is None else {"nest": nest, **({"missing": True} if missing else {})}
    observe_p.bind(value, *params, *extra, dist=dist, strategy=None, addr=addr,
                   n_params=len(params), masked=mask is not None, **named)


@contextlib.contextmanager
def scaled_by(factor: float) -> Iterator[None]:
    """Mark where a `gv.plate`'s body (or a NumPyro site under a plate's or `scale`'s
    factor) begins and ends in a program's jaxpr: the interpreters multiply the log
    densities of the sites and observations traced inside (nested bodies included) by
    `factor`; a factor of 1 binds no markers. Markers, not a parameter of each site, so
    that a function JAX traced once and reuses from its caches (a scan or jit body) is
    scaled by the plate it runs in.

    Example:
        >>> import jax
        >>> def body():
        ...     with scaled_by(4.0):
        ...         pass
        >>> [plate_marker(e) for e in jax.make_jaxpr(body)().jaxpr.eqns]
        [(True, 4.0), (False, 4.0)]
    """
    if factor == 1.0:
        yield
        return
    plate_p.bind(factor=float(factor), enter=True)
    yield
    plate_p.bind(factor=float(factor), enter=False)


@dataclasses.dataclass(frozen=True)
class SiteEqn:
    """A typed view of one of genvi's site equations (`site_p`, `sample_p`,
    `observe_p`): the one reader of their static parameters outside this module.

    `addr` is None for an unnamed observation or `gv.sample`; `strategy` the static
    part of the gradient strategy (None if none); `n_params` how many operands are
    the distribution's parameters; `masked` whether the last operand is a lane mask
    (a site in an untaken branch of a batched cond, at `branch`); `nest` the
    combinators around a named site; `missing` an observation given no value;
    `batch_axes` how many leading axes of its value are lanes of `vmap` transformations (plates,
    particles) rather than the site's own; `auxiliary` a site scored in its program's
    density but not one of its choices.

    Example:
        >>> import jax, genvi as gv
        >>> bind = lambda: bind_site(site_p, gv.normal, (0.0, 1.0), None, ("x",))
        >>> (eqn,) = jax.make_jaxpr(bind)().jaxpr.eqns
        >>> s = SiteEqn.of(eqn)
        >>> s.addr, s.dist.name, s.n_params
        (('x',), 'normal', 2)
    """
    eqn: Any
    addr: tuple | None
    dist: Any
    strategy: Any
    n_params: int
    masked: bool
    nest: tuple
    branch: tuple
    missing: bool
    batch_axes: int = 0
    auxiliary: bool = False

    @property
    def is_observation(self) -> bool:
        return self.eqn.primitive is observe_p

    @property
    def value_shape(self) -> tuple:
        """The shape of a sampling site's value (an observation's is its operand's)."""
        return tuple(self.eqn.outvars[0].aval.shape)

    @staticmethod
    def of(eqn: Any) -> "SiteEqn":
        p = eqn.params
        return SiteEqn(eqn, p["addr"], p["dist"], p["strategy"], p["n_params"],
                       bool(p.get("masked")), p.get("nest", ()), p.get("branch", ()),
                       bool(p.get("missing")), p.get("batch_axes", 0),
                       bool(p.get("auxiliary")))

    def with_strategy(self, strategy: Any) -> Any:
        """The equation with an operand-free `strategy` in place of its own (a
        placeholder's choice, made before a run: `genvi.adev.placeholders.resolved`)."""
        return self.eqn.replace(params={**self.eqn.params, "strategy": strategy})


def plate_marker(eqn: Any) -> tuple[bool, float]:
    """(enters, factor) of a `gv.plate` marker equation (see `scaled_by`)."""
    return eqn.params["enter"], eqn.params["factor"]


def site_parts(eqn: Any, invals: list, tangents: list | None = None) -> tuple:
    """(dist, params, strategy joined with its operands, addr) of a site equation.

    For a masked site the distribution is wrapped in `Masked`, whose log density is
    zero in masked-off lanes (and which carries the site's `branch` path)."""
    p = eqn.params
    n = p["n_params"]
    invals = list(invals)
    dist = p["dist"]
    if p.get("masked"):
        dist = Masked(dist, invals.pop(), p.get("branch", ()))
        tangents = None if tangents is None else list(tangents)[:-1]
    strategy = p["strategy"]
    if strategy is not None:
        strategy = strategy.join(tuple(invals[n:]),
                                 None if tangents is None else tuple(tangents[n:]))
    return dist, tuple(invals[:n]), strategy, p["addr"]


# density-bearing hooks a strategy calls on a distribution, beyond its log density:
# name -> how to zero a result's masked-off lanes (see `register_masked_hook`)
_MASKED_HOOKS: dict = {}


def register_masked_hook(name: str, zero_masked: Any) -> None:
    """Declare `name` a distribution hook whose result carries density (a strategy's
    terms, as MVD's `mvd_terms`), so that at a site in an untaken branch of a batched
    `cond` it is called and its masked-off lanes are zeroed by
    `zero_masked(result, keep)`, with `keep(x)` the mask broadcast like `x`. A hook
    not declared is refused there, naming it. The strategy that calls the hook
    declares it, once, in its own module.

    Args:
        name: the distribution method's name.
        zero_masked: `(result, keep) -> result` with the masked lanes' terms zero.

    Example:
        >>> import jax.numpy as jnp, genvi as gv
        >>> register_masked_hook("my_weights", lambda w, keep: jnp.where(keep(w), w, 0.0))
        >>> class Weighted(type(gv.flip)):
        ...     def my_weights(self, p):
        ...         return jnp.ones_like(p)
        >>> Masked(Weighted(), jnp.array([True, False])).my_weights(jnp.ones(2)).tolist()
        [1.0, 0.0]
    """
    _MASKED_HOOKS[name] = zero_masked


class Masked:
    """A distribution whose lanes where `mask` is False contribute no density (and
    no gradient terms): a site inside an untaken branch of a batched `cond`.

    `path` locates the site among batched conds: ((cond token, branch index), ...),
    outermost first. Two sites of one address whose paths part at the same cond
    with different branch indices are never executed in the same lane.

    Example:
        >>> import jax.numpy as jnp, genvi as gv
        >>> m = Masked(gv.normal, jnp.array([True, False]))
        >>> round(float(m.log_prob(jnp.zeros(2), 0.0, 1.0)), 4)  # the second lane: not scored
        -0.9189
    """

    is_masked = True
    #: the distribution's methods that hold no density, forwarded unmasked; its density
    #: (`lane_log_prob`, `lane_prob`, `log_prob`) is masked below, the hooks strategies
    #: declared with `register_masked_hook` by their declaration, and any other method
    #: is refused
    MASK_FREE = frozenset({"sample", "support", "check_params", "check_value", "value_shape",
                           "supports", "instance", "event_bijector", "how_to_set_grad"})

    def __init__(self, base: Any, mask: Any, path: tuple = ()):
        self.base, self.mask, self.path = base, mask, path

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.base, name)
        if not callable(value) or name.startswith("_") or name in self.MASK_FREE:
            return value
        zero_masked = _MASKED_HOOKS.get(name)
        if zero_masked is None:
            # a hook genvi does not know how to mask would let masked lanes leak gradient
            known = ", ".join(["lane_log_prob", "lane_prob", "log_prob", *sorted(_MASKED_HOOKS)])
            raise AttributeError(
                f"gv.{self.base.name}.{name} was asked for at a site in an untaken branch of "
                f"a batched cond (a masked site): genvi masks {known} there, and does not "
                f"know how to mask {name!r}. Declare how with "
                "genvi.core.primitives.register_masked_hook, or build the strategy's terms on "
                "those (docs/extending.md), or keep the site out of a cond whose branch "
                "differs from lane to lane.")
        return lambda *args, **kwargs: zero_masked(value(*args, **kwargs), self._mask_like)

    def lane_log_prob(self, value, *params):
        lp = self.base.lane_log_prob(value, *params)
        return jax.numpy.where(self._mask_like(lp), lp, 0.0)

    def lane_prob(self, value, *params):
        p = self.base.lane_prob(value, *params)
        return jax.numpy.where(self._mask_like(p), p, 1.0)

    def log_prob(self, value, *params):
        return jax.numpy.sum(self.lane_log_prob(value, *params))

    def where(self, value):
        """The value in executed lanes, zeros elsewhere (what choice maps record)."""
        return jax.numpy.where(self._mask_like(value), value, jax.numpy.zeros_like(value))

    def _mask_like(self, x):
        m = self.mask
        m = m.reshape(m.shape + (1,) * max(0, jax.numpy.ndim(x) - m.ndim))
        return jax.numpy.broadcast_to(m, jax.numpy.broadcast_shapes(m.shape, jax.numpy.shape(x)))


def run_masked(closed: Any, mask: Any, args: list, path: tuple = ()) -> list:
    """Evaluate a branch jaxpr with its sites masked by `mask` (see
    `jx.genvi_conds`); nested conds, scans and calls are followed.

    Each site's static `branch` parameter becomes `path` (the (cond token, branch
    index) pairs of the batched conds around it, outermost first) followed by the
    path it already had, so the interpreters can merge records of one address made
    in different branches of one cond (`Handler.record`) and refuse any other reuse."""
    return walk(closed.jaxpr, env_of(closed, args), _Masking(mask, path))


def _mask_site(hooks: "_Masking", i: int, eqn: Any, ins: list) -> list:
    p = dict(eqn.params)
    if p.get("masked"):
        mask_here = jax.numpy.logical_and(ins.pop(), hooks.mask)
    else:
        mask_here = hooks.mask
    p["masked"] = True
    p["branch"] = hooks.path + p.get("branch", ())
    return jx.eval_eqn_with(eqn, ins + [mask_here], p)


class _Masking(Hooks):
    """`run_masked`'s hooks: every site gains the mask; control flow is followed."""

    rules = {site_p: _mask_site, sample_p: _mask_site, observe_p: _mask_site}
    holds = MASKABLE

    def __init__(self, mask: Any, path: tuple):
        self.mask, self.path = mask, path

    def call(self, i, view, ins):
        return run_masked(view.body, self.mask, ins, self.path)

    def cond(self, i, view, ins):
        index, ops = view.split(ins)
        index = jax.numpy.clip(index, 0, len(view.branches) - 1)
        token = jx.cond_token()
        outs = [run_masked(b, jax.numpy.logical_and(self.mask, index == j), ops,
                           self.path + ((token, j),))
                for j, b in enumerate(view.branches)]
        return [jax.lax.select_n(jax.numpy.broadcast_to(index, c[0].shape), *c)
                for c in zip(*outs)]

    def scan(self, i, view, ins):
        consts, init, xs = view.split(ins)

        def step(carry, x):
            outs = run_masked(view.body, self.mask, consts + list(carry) + list(x), self.path)
            new, ys = view.split_outs(outs)
            return tuple(new), tuple(ys)

        carry, ys = view.scan(step, tuple(init), tuple(xs))
        return list(carry) + list(ys)

    def unsupported(self, i, eqn, ins):
        raise NotImplementedError(
            f"sampling sites inside `{eqn.primitive.name}` inside a batched cond are not "
            "supported")


def _own_batching(branches: Any) -> bool:
    """Conds batched by genvi's rule: those with sites, and every cond traced inside
    an objective or emitted by the ADEV interpreter (e.g. the ones `log_density`
    emits, and replays). JAX's rule broadcasts every operand of
    a batched cond, parameters included, so their gradients become per-lane arrays;
    ours keeps unbatched operands unbatched."""
    return bool(IN_OBJECTIVE) or bool(GENVI_CONDS) or any(jx.contains(b, MASKABLE) for b in branches)


jx.set_cond_batching(_own_batching,
                     lambda branch, mask, ops, label: run_masked(branch, mask, ops, (label,)))
