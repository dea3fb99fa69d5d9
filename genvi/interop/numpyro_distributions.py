"""NumPyro distributions as genvi distributions (`gv.from_numpyro`'s sites). Imported with
`numpyro_program`, on `gv.from_numpyro`'s first call: `import genvi` never loads NumPyro.

`wrap(d)` turns a `numpyro.distributions.Distribution` instance into a genvi
distribution and its parameters: the instance's pytree leaves are the site's operands
and its pytree structure (class, batch and event shape, static fields) the static
part, so the instance is sampled and scored by its own methods (`d.sample`,
`d.log_prob`), whatever its class: a masked, expanded, independent or transformed
distribution included. Its capabilities come from NumPyro's own declarations:

* `has_rsample` → `reparameterized` (REPARAM);
* a Normal, Bernoulli, categorical (logits) or Poisson, alone, expanded or independent:
  the measure-valued and stochastic derivative terms of genvi's own law (MVD, SD);
* `has_enumerate_support` with a support known when the program is traced (a
  Binomial's `total_count` a Python number or numpy array) and scalar values → `support`
  (ENUM, `gv.enumeration`); a Bernoulli is `binary` (DisARM);
* `support`, a NumPyro constraint → `domain` for automatic guides and validation:
  real, positive and unit interval as genvi's own (the same bijectors), any other
  through NumPyro's `biject_to` (`event_bijector`), so that `gv.auto_normal` over a
  NumPyro model is NumPyro's `AutoNormal` family (a simplex by stick-breaking).

Under `jax.vmap` (particles, `gv.vmap` around an adapted program) genvi's batching rule
gives every operand the same leading lane axes; the first operand, a placeholder of
the lanes' shape, says how many, and the instance is mapped over them, each lane with
its own key.

Example:
    >>> import numpyro.distributions as nd, jax
    >>> dist, params = wrap(nd.Normal(0.0, 2.0))
    >>> dist.name, dist.reparameterized, round(float(dist.log_prob(1.0, *params)), 4)
    ('numpyro.Normal', True, -1.7371)
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as nd

from genvi.core.address import Address
from genvi.distributions.base import Distribution
from genvi.distributions.binary import Bernoulli, Flip
from genvi.distributions.continuous import Normal
from genvi.distributions.discrete import Categorical, Poisson


#: NumPyro classes whose `sample` draws each lane from that lane's parameters alone
#: (elementwise samplers): lane-local replays follow such draws in O(lanes). Keyed by
#: the class itself: a user's class of the same name is none of them.
_LANEWISE = frozenset({
    nd.Normal, nd.LogNormal, nd.HalfNormal, nd.Cauchy, nd.HalfCauchy, nd.Laplace,
    nd.Exponential, nd.Uniform, nd.Gamma, nd.Beta, nd.StudentT, nd.Gumbel, nd.Logistic,
    nd.BernoulliProbs, nd.BernoulliLogits, nd.CategoricalProbs, nd.CategoricalLogits,
    nd.Poisson, nd.Delta})
#: NumPyro classes whose law is a genvi distribution's with the same parameters (by
#: NumPyro's names, in genvi's order): MVD's and SD's terms come from genvi's formulas
_TWINS = {nd.Normal: (Normal(), ("loc", "scale")), nd.BernoulliProbs: (Flip(), ("probs",)),
          nd.BernoulliLogits: (Bernoulli(), ("logits",)),
          nd.CategoricalLogits: (Categorical(), ("logits",)), nd.Poisson: (Poisson(), ("rate",))}
#: wrappers that leave each element's law and its parameters as they are (a mask does not)
_SAME_LAW = frozenset({nd.Independent, nd.ExpandedDistribution})
#: wrappers that sample through their base distribution unchanged per lane
_THROUGH = _SAME_LAW | {nd.MaskedDistribution}


@jax.tree_util.register_pytree_node_class
class _Lifted:
    """A NumPyro distribution whose static part held arrays (a `Multinomial`'s
    `total_count`: NumPyro lists it among its pytree's aux fields), with those arrays
    made leaves: the static part of a site outlives the trace that made it, so a
    traced array there would leak (`UnexpectedTracerError`).

    Example:
        >>> d = nd.Multinomial(total_count=jnp.array([3, 4]), probs=jnp.ones(2) / 2)
        >>> len(jax.tree_util.tree_leaves(d)), len(jax.tree_util.tree_leaves(_lifted(d)))
        (1, 2)
        >>> type(_instance(_lifted(d))).__name__
        'MultinomialProbs'
    """

    def __init__(self, cls: Any, data: Any, arrays: tuple, static: tuple):
        self.cls, self.data, self.arrays, self.static = cls, data, arrays, static

    def tree_flatten(self) -> tuple[tuple, tuple]:
        return (self.data, self.arrays), (self.cls, self.static)

    @classmethod
    def tree_unflatten(cls, aux: tuple, children: tuple) -> "_Lifted":
        return cls(aux[0], children[0], children[1], aux[1])

    def instance(self) -> Any:
        arrays = iter(self.arrays)
        aux = tuple(next(arrays) if s is _ARRAY else s for s in self.static)
        return self.cls.tree_unflatten(aux, _map_distributions(_instance, self.data, _Lifted))


_ARRAY = object()   # where `_Lifted.static` had an array


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def _map_distributions(f: Any, tree: Any, kind: type) -> Any:
    """`f` applied to each `kind` instance in `tree` (a pytree)."""
    return jax.tree_util.tree_map(lambda x: f(x) if isinstance(x, kind) else x, tree,
                                  is_leaf=lambda x: isinstance(x, kind))


def _lifted(d: Any) -> Any:
    """`d`, or a `_Lifted` where it (or a distribution it holds) keeps arrays in its
    static part."""
    data, aux = d.tree_flatten()   # NumPyro's pytree protocol
    data = _map_distributions(_lifted, data, nd.Distribution)
    if not any(_is_array(a) for a in aux) and not any(
            isinstance(x, _Lifted) for x in jax.tree_util.tree_leaves(
                data, is_leaf=lambda x: isinstance(x, _Lifted))):
        return d
    arrays = tuple(jnp.asarray(a) for a in aux if _is_array(a))
    static = tuple(_ARRAY if _is_array(a) else a for a in aux)
    return _Lifted(type(d), data, arrays, static)


def _instance(x: Any) -> Any:
    """The NumPyro instance `x` stands for (`x` itself unless it is `_Lifted`)."""
    return x.instance() if isinstance(x, _Lifted) else x


def _unwrapped(d: Any, wrappers: frozenset) -> Any:
    """`d` with the wrapper classes in `wrappers` taken off (their `base_dist`)."""
    while type(d) in wrappers:
        d = d.base_dist
    return d


def _twin(treedef: Any, count: int) -> tuple[Any, tuple[int, ...]] | None:
    """(genvi distribution, the operand index of each of its parameters) where the
    instance is one of `_TWINS`, expanded or made independent at
    most."""
    probe = _instance(jax.tree_util.tree_unflatten(treedef, list(range(count))))  # leaf i -> i
    probe = _unwrapped(probe, _SAME_LAW)
    twin = _TWINS.get(type(probe))
    if twin is None:
        return None
    where = [probe.__dict__.get(name) for name in twin[1]]
    if not all(isinstance(i, int) for i in where):
        return None
    return twin[0], tuple(1 + i for i in where)   # operand 0 is the lanes' placeholder


def base_constraint(constraint: Any) -> Any:
    """A NumPyro constraint without its `independent` wrappers (a vector of reals: the
    reals).

    Example:
        >>> from numpyro.distributions import constraints
        >>> base_constraint(constraints.real_vector) is constraints.real
        True
    """
    while isinstance(constraint, nd.constraints.independent):
        constraint = constraint.base_constraint
    return constraint


def _constraint_domain(support: Any) -> str | None:
    """genvi's domain for a NumPyro support whose genvi bijector is NumPyro's own
    (`biject_to`: identity, exp, sigmoid), else None."""
    c = nd.constraints
    support = base_constraint(support)
    if support is c.real:
        return "real"
    if support is c.positive:
        return "positive"
    if support is c.unit_interval:
        return "unit_interval"
    return None


def _static_support(d: Any) -> np.ndarray | None:
    """One lane's finite support where NumPyro enumerates it from static values, else
    None (no enumerable support, vector values, or a support that depends on traced
    parameters, such as a Binomial whose total_count is traced)."""
    if not d.has_enumerate_support or d.event_shape:
        return None
    try:
        with jax.ensure_compile_time_eval():
            values = d.enumerate_support(expand=False)
        return np.asarray(values).reshape(-1)
    except (NotImplementedError, TypeError, ValueError, jax.errors.ConcretizationTypeError,
            jax.errors.TracerArrayConversionError):
        return None


def lane_keys(key: jax.Array, lanes: tuple) -> jax.Array:
    """One key per lane (`key` itself where there are no lanes)."""
    if not lanes:
        return key
    return jnp.reshape(jax.random.split(key, math.prod(lanes)), lanes)


def over_lanes(lanes: tuple, fn: Any, *xs: Any) -> Any:
    """`fn(*xs)` mapped over the lane axes `lanes` in front of every `xs` (called once
    where there are none): each lane's draw and density from that lane's operands."""
    if not lanes:
        return fn(*xs)
    n = math.prod(lanes)
    out = jax.vmap(fn)(*[jnp.reshape(x, (n,) + jnp.shape(x)[len(lanes):]) for x in xs])
    return jnp.reshape(out, lanes + jnp.shape(out)[1:])


class NumPyroBijector:
    """A NumPyro transform onto a support, read as genvi's automatic guides read a TFP
    bijector (`forward`, `inverse`, `forward_log_det_jacobian`,
    `forward_min_event_ndims`)."""

    def __init__(self, transform: Any):
        self.transform = transform
        self.forward_min_event_ndims = transform.domain.event_dim

    def forward(self, u: Any) -> Any:
        return self.transform(u)

    def inverse(self, y: Any) -> Any:
        return self.transform.inv(y)

    def forward_log_det_jacobian(self, u: Any, event_ndims: int) -> Any:
        ladj = self.transform.log_abs_det_jacobian(u, self.transform(u))
        extra = event_ndims - self.forward_min_event_ndims
        return jnp.sum(ladj, axis=tuple(range(-extra, 0))) if extra > 0 else ladj


class NumPyroDistribution(Distribution):
    """A NumPyro distribution instance's structure as a genvi distribution; its operands
    are a placeholder of the lanes' shape and the instance's pytree leaves (see the
    module docstring). Made by `wrap`.

    Example:
        >>> import numpyro.distributions as nd
        >>> dist, params = wrap(nd.Bernoulli(probs=0.3))
        >>> dist.binary, [int(v) for v in dist.support(*params)]
        (True, [0, 1])
    """

    #: its bijector's log-Jacobian is in the measure of its own densities (NumPyro's
    #: stick-breaking onto the simplex: the first K − 1 coordinates, as its Dirichlet)
    bijector_matches_density = True

    def __init__(self, treedef: Any, leaf_ndims: tuple[int, ...], cls_name: str,
                 reparameterized: bool, support: np.ndarray | None, domain: str | None,
                 lanewise: bool, event_ndim: int, fixed_support: Any = None):
        self.treedef, self.leaf_ndims = treedef, leaf_ndims
        self.name = f"numpyro.{cls_name}"
        self.cls_name = cls_name
        self.reparameterized = reparameterized
        self.domain = domain
        self.lanewise = lanewise
        self.value_event_ndim = event_ndim
        # every operand is whole per lane: genvi's batching adds lane axes in front only
        self.param_event_ndims = (0,) + leaf_ndims
        self._support = support
        self._fixed_support = fixed_support   # a support constraint without parameters
        self._twin = _twin(treedef, len(leaf_ndims))
        twin = None if self._twin is None else self._twin[0]
        if hasattr(twin, "mvd_terms"):   # the capabilities MVD and SD need, from the twin
            self.mvd_terms = self._twin_mvd_terms
        if hasattr(twin, "sd_terms"):
            self.sd_terms = self._twin_sd_terms
        if support is not None:
            self.support = self._finite_support
            self.binary = bool(np.array_equal(np.sort(support), [0, 1]))

    @property
    def label(self) -> str:
        return f"numpyro's {self.cls_name}"   # in messages, where genvi's say "gv.normal"

    def instance(self, *params: Any) -> Any:
        """The NumPyro instance at these operands (without lane axes)."""
        return _instance(jax.tree_util.tree_unflatten(self.treedef, params[1:]))

    def _per_lane(self, method: Any, params: tuple, *per_lane: Any) -> Any:
        """`method(instance, *per_lane)` mapped over the lane axes in front of every
        operand (`params[0]`'s shape), with `per_lane` sliced the same way."""
        k = len(params)
        return over_lanes(jnp.shape(params[0]),
                           lambda *xs: method(self.instance(*xs[:k]), *xs[k:]),
                           *params, *per_lane)

    def sample(self, key, *params):
        keys = lane_keys(key, jnp.shape(params[0]))
        return self._per_lane(lambda d, k: d.sample(k), params, keys)

    def lane_log_prob(self, value, *params):
        return self._per_lane(lambda d, v: d.log_prob(v), params, jnp.asarray(value))

    def _twin_params(self, params: tuple, tangents: tuple) -> tuple[tuple, tuple]:
        assert self._twin is not None  # the terms that read it come with a twin law
        _, where = self._twin
        return tuple(params[i] for i in where), tuple(tangents[i] for i in where)

    def _twin_mvd_terms(self, key, x, params, tangents):
        """The measure-valued derivative terms of genvi's twin law (`_TWINS`)."""
        return self._twin[0].mvd_terms(key, x, *self._twin_params(params, tangents))

    def _twin_sd_terms(self, x, params, tangents):
        """The stochastic-derivative terms of genvi's twin law (`_TWINS`)."""
        return self._twin[0].sd_terms(x, *self._twin_params(params, tangents))

    def how_to_set_grad(self, addr: tuple, kind: str) -> str:
        """How a NumPyro site takes a strategy (the missing-strategy error's example)."""
        name = str(Address(addr))
        return (f"infer={{'grad': gv.{kind}}} in numpyro.sample({name!r}, ...), or "
                f"gv.from_numpyro(fn, strategies={{{name!r}: gv.{kind}}})")

    def _finite_support(self, *params: Any) -> Any:
        return jnp.asarray(self._support)

    def own_support_params(self, *params: Any) -> tuple:
        """What `event_bijector` needs of the parameters: none where the support has
        no parameters (a simplex), else all of them (an interval's bounds)."""
        return () if self._fixed_support is not None else params

    def event_bijector(self, *params: Any) -> Any:
        """NumPyro's `biject_to` onto this distribution's support (`domain == "own"`),
        given `own_support_params`."""
        support = (self._fixed_support if self._fixed_support is not None
                   else self.instance(*params).support)
        return NumPyroBijector(nd.transforms.biject_to(support))

    def check_value(self, value, *params):
        ok = self._per_lane(lambda d, v: d.support(v), params, jnp.asarray(value))
        return [(ok, f"must be in the support of {self.label} "
                     f"({self.instance_support(params)})")]

    def instance_support(self, params: tuple) -> str:
        """The NumPyro support constraint, as NumPyro prints it."""
        return type(self.instance(*params).support).__name__.lstrip("_")

    def __eq__(self, other):
        return (isinstance(other, NumPyroDistribution) and other.treedef == self.treedef
                and other.leaf_ndims == self.leaf_ndims
                and _same_support(other._support, self._support))

    def __hash__(self):
        return hash((self.treedef, self.leaf_ndims))

    def __repr__(self) -> str:
        return self.name


def _same_support(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None
                                         and np.array_equal(a, b))


def wrap(d: Any) -> tuple[NumPyroDistribution, tuple]:
    """A NumPyro distribution instance as a genvi distribution and its operands.

    Args:
        d: a `numpyro.distributions.Distribution` instance.

    Returns:
        `(dist, params)`: `dist(*params) @ "x"` samples it at a site, and
        `gv.observe(dist(*params), y)` scores `y` under it.

    Example:
        >>> import numpyro.distributions as nd
        >>> dist, params = wrap(nd.Categorical(logits=jnp.zeros(3)))
        >>> dist.name, [int(v) for v in dist.support(*params)]
        ('numpyro.CategoricalLogits', [0, 1, 2])
    """
    leaves: list | tuple
    leaves, treedef = jax.tree_util.tree_flatten(_lifted(d))
    leaves = tuple(jnp.asarray(x) for x in leaves)
    base = _unwrapped(d, _THROUGH)
    domain = _constraint_domain(d.support)
    if domain is None and not d.support.is_discrete:
        domain = "own"
    fixed = d.support if not jax.tree_util.tree_leaves(d.support) else None
    dist = NumPyroDistribution(
        treedef, tuple(jnp.ndim(x) for x in leaves), type(d).__name__, bool(d.has_rsample),
        _static_support(d), domain, type(base) in _LANEWISE, len(d.event_shape),
        fixed)
    return dist, (jnp.zeros((), jnp.int8),) + leaves
