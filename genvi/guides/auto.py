"""Automatic guides: the `AutoGuide` base program, its sites' sampling, and summaries.

An automatic guide is a `@gv.gen` program (a `GenFn`) built from a model. `init(key,
*args)` runs the model on example arguments to find its latent sites: addresses,
shapes, distributions and supports (`genvi.guides.discover`). Every continuous site
is then sampled by the guide in an unconstrained space and mapped onto its support
by a TFP bijector (`genvi.guides.supports`); its log density is the transformed
density, with the exact log-Jacobian. Guide sites use REPARAM.

**Parameters.** The guide has the model's signature and reads its own parameters
from the first argument's `"guide"` entry (`params_key=`). So a model written as
`model(params, *data)` trains with `{"guide": auto.init(key, params, *data),
**model_params}` (the model ignores the extra entry). A model written without
`params` (`def model(y)`) needs no entry: the first argument is the guide's alone,
`gv.fit(gv.elbo(model, auto), auto.init(key, y), y, ...)`:

    auto = gv.auto_normal(model)
    params = {"guide": auto.init(jax.random.key(0), {}, y)}
    result = gv.fit(gv.elbo(model, auto), params, y, optimizer=..., steps=..., key=...)
    auto.median(result.params)          # {address: posterior median}

Joint families (`auto_mvn`, `auto_low_rank`, `auto_flow`) sample the sites one after
another from their conditionals given the earlier sites (the chain rule), so each
site's density is exact and the guide's choices sit at the model's addresses.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from genvi.adev.strategies import REPARAM
from genvi.core.addressing import current_prefix, prefixed
from genvi.core.choices import ChoiceMap
from genvi.core.program_mistakes import require_program
from genvi.gen import language
from genvi.guides.blocks import Block
from genvi.guides.discover import PRIOR_DRAWS, Site, discover
from genvi.guides.init_rules import InitRule, check_values, init_to_uniform

def sample_site(family: Any, site: Site, params: Sequence) -> jax.Array:
    """Sample `site` from `family` with `params` (plus the site's bounds) at its
    address, under the enclosing program's prefix; returns the constrained value."""
    params = tuple(jnp.asarray(p) for p in params) + tuple(jnp.asarray(b) for b in site.bounds)
    dist = Block(family, site, tuple(jnp.ndim(p) for p in params))
    call = dist(*params, grad=REPARAM)
    prefix = current_prefix("an automatic guide's site")
    with prefixed(prefix + site.addr[:-1]):
        return call @ site.addr[-1]


class AutoGuide(language.GenFn):
    """Base class of the automatic guides (see the module docstring).

    Subclasses define `family_init(key, sites, z0)` (parameters from the
    unconstrained starting locations `z0`), `run(params, sites)` (sample every site,
    in order, with `sample_site`) and may override the summaries.

    Example:
        >>> import genvi as gv
        >>> @gv.gen
        ... def model(params):
        ...     gv.normal(0.0, 1.0) @ "x"
        >>> isinstance(gv.auto_normal(model), gv.AutoGuide)
        True
    """

    kind = "auto"
    _sampler: Any  # `sample`'s jitted draws, compiled once per guide (None: not yet)

    def __init__(self, model: language.GenFn, *, params_key: str = "guide",
                 exclude: Sequence = (), init_scale: float = 0.1,
                 init: InitRule | None = None):
        super().__init__()
        require_program(model, "model", f"gv.{self.kind}(model)")
        self.model, self.params_key, self.exclude = model, params_key, tuple(exclude)
        self.init_scale = float(init_scale)
        self.init_rule = init if init is not None else init_to_uniform()
        self.name = f"{self.kind}({model.name})"
        self.sites: list[Site] | None = None

    # -- parameters ------------------------------------------------------------------
    def init(self, key: jax.Array, *args: Any) -> Any:
        """Discover the model's latent sites on `args` (the model's arguments) and
        return this guide's initial parameters (locations by the guide's `init=` rule:
        uniform in (−2, 2), unconstrained, unless given; `genvi.guides.init_rules`).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params, y):
            ...     p = gv.beta(10.0, 10.0) @ "p"
            ...     gv.observe(gv.flip(p), y)
            >>> auto = gv.auto_normal(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {}, True)}
        """
        k_sites, k_init = jax.random.split(key)
        sites, draws = discover(self.model, k_sites, args, self.exclude, who=self.kind,
                                draws=PRIOR_DRAWS, call_args=self.call_args())
        self.sites, self._sampler = sites, None
        rule = self.init_rule

        @jax.jit
        def locations(draws):  # each site's start, unconstrained (`init_rules`)
            return {s.name: rule(s, draws[s.name], jax.random.fold_in(k_sites, i))
                    for i, s in enumerate(sites)}
        z0 = locations({s.name: draws[s.addr] for s in sites})
        check_values(rule, sites, z0, self.kind)
        return self.family_init(k_init, sites, z0)

    def discover(self, *args: Any) -> "AutoGuide":
        """Find the model's latent sites from the shapes of its arguments, without
        initial parameters: for a guide whose parameters come from elsewhere (a
        checkpoint, a saved fit). `args` are the model's arguments as `init` takes
        them; arrays may be given as `jax.ShapeDtypeStruct`, since only their shapes
        and dtypes are read. A site whose support depends on the data's values is
        refused (pass the data itself). Returns the guide.

        A guide that was neither initialized nor discovered discovers its sites the
        first time it runs, from the shapes of the arguments it is called with
        (`gv.predictive`, objectives); the summaries (`median`, `quantiles`,
        `sample`) need one of the two calls first.

        Example:
            >>> import genvi as gv, jax, jax.numpy as jnp
            >>> @gv.gen
            ... def model(params, y):
            ...     gv.normal(jnp.zeros(3), 1.0) @ "mu"
            ...     gv.observe(gv.normal(0.0, 1.0), y)
            >>> auto = gv.auto_normal(model).discover({}, jax.ShapeDtypeStruct((5,), jnp.float32))
            >>> auto.layout()
            {'mu': (0, 3, (3,))}
        """
        def placeholders(fill: int) -> tuple:
            def leaf(a: Any) -> Any:
                if isinstance(a, (jax.ShapeDtypeStruct, jax.core.Tracer)):
                    return np.full(a.shape, fill, a.dtype)
                return a
            return jax.tree_util.tree_map(leaf, args)

        def sites_of(values: tuple) -> list[Site]:
            def run() -> list[Site]:
                return discover(self.model, jax.random.key(0), values, self.exclude,
                                who=self.kind, draws=2, call_args=self.call_args())[0]
            # JAX's tracing state is per thread: a thread of its own runs the model
            # eagerly even while a caller (gv.fit, jit) is tracing this guide
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                return pool.submit(run).result()

        shapes_only = any(isinstance(a, (jax.ShapeDtypeStruct, jax.core.Tracer))
                          for a in jax.tree_util.tree_leaves(args))
        sites = sites_of(placeholders(0))
        if shapes_only:
            for site, other in zip(sites, sites_of(placeholders(1))):
                if not all(np.array_equal(a, b) for a, b in zip(site.bounds, other.bounds)):
                    raise ValueError(
                        f"{self.name}: the support of site {site.name!r} ({site.dist.label}) "
                        "depends on the values of the model's arguments, so their shapes are "
                        "not enough to build the guide: call auto.init(key, *args) or "
                        "auto.discover(*args) with the data itself")
        self.sites, self._sampler = sites, None
        return self

    def layout(self) -> dict:
        """Where each site sits in the guide's flat unconstrained vector (the `loc` of
        `auto_mvn` and `auto_low_rank`, a flow's coordinates): {address: (start, stop,
        unconstrained shape)}, in the order the model visits its sites.

        Example:
            >>> import genvi as gv, jax, jax.numpy as jnp
            >>> @gv.gen
            ... def model(params):
            ...     gv.normal(jnp.zeros(2), 1.0) @ "a"
            ...     gv.dirichlet(jnp.ones(3)) @ "w"
            >>> auto = gv.auto_mvn(model)
            >>> _ = auto.init(jax.random.key(0), {})
            >>> auto.layout()
            {'a': (0, 2, (2,)), 'w': (2, 4, (2,))}
        """
        out, start = {}, 0
        for s in self._check_ready():
            out[s.name] = (start, start + s.size, tuple(s.ushape))
            start += s.size
        return out

    def call_args(self) -> str:
        """This guide's required constructor arguments after the model, as code (""
        here; ", rank=2" for `gv.auto_low_rank`): error messages quote them in fixes."""
        return ""

    def guide_params(self, params: Any) -> Any:
        """This guide's own parameters: `params[params_key]` for a dict holding them
        (the first argument of the guide), else `params` itself."""
        if isinstance(params, Mapping) and self.params_key in params:
            return params[self.params_key]
        return params

    def _check_ready(self) -> list[Site]:
        if self.sites is None:
            raise RuntimeError(f"{self.name}: call .init(key, *args) with the model's "
                               "arguments first (or .discover(*args) for parameters restored "
                               "from elsewhere: only the arguments' shapes are read); it "
                               "traces the model to find its latent sites.")
        return self.sites

    # -- the program -----------------------------------------------------------------
    def body(self, *args: Any) -> dict:
        if self.sites is None:  # parameters from elsewhere (a checkpoint): sites from shapes
            self.discover(*args)
        sites = self._check_ready()
        if args and isinstance(args[0], Mapping) and self.params_key in args[0]:
            return self.run(self._started(args[0][self.params_key]), sites)
        if args and self._model_takes_no_params(args):  # the first argument is ours alone
            return self.run(self._started(args[0]), sites)
        got = type(args[0]).__name__ if args else "no arguments"
        raise TypeError(
            f"{self.name} reads its parameters from the first argument's "
            f"{self.params_key!r} entry, as the model's first argument: pass "
            f"{{{self.params_key!r}: auto.init(key, *args), **model_params}}; got {got}. "
            "(A model written without a params argument needs no entry: pass "
            "auto.init(key, *data) itself.)")

    def _started(self, params: Any) -> Any:
        if isinstance(params, Mapping) and not params:
            raise RuntimeError(f"{self.name} was given no parameters: call .init(key, *args) "
                               "with the model's arguments for its initial ones, or pass "
                               "parameters saved from a fit")
        return params

    def _model_takes_no_params(self, args: tuple) -> bool:
        """Whether the model is written without `params` (`def model(*data)`), so the
        first of the arguments it is given is this guide's parameters alone."""
        arguments = getattr(self.model, "arguments", None)
        return arguments is not None and len(arguments(args)) == len(args) - 1

    def inline(self, *args: Any) -> dict:
        """Sample this guide's sites inside another `@gv.gen` guide (at the caller's
        address prefix): how an automatic guide combines with hand-written sites.

        Example:
            >>> import genvi as gv
            >>> # auto = gv.auto_normal(model, exclude=["c"])
            >>> @gv.gen
            ... def guide(params, y):
            ...     z = auto.inline(params, y)          # {"mu": value, ...}
            ...     gv.categorical(params["logits"], grad=gv.ENUM) @ "c"
        """
        return self.body(*args)

    def family_init(self, key: jax.Array, sites: list[Site], z0: dict) -> Any:
        raise NotImplementedError

    def run(self, params: Any, sites: list[Site]) -> dict:
        raise NotImplementedError

    # -- summaries -------------------------------------------------------------------
    def sample(self, key: jax.Array, params: Any, n: int) -> dict:
        """`n` draws from the fitted guide: {address: array with a leading axis n}
        (constrained values).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_normal(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> auto.sample(jax.random.key(1), params, 1000)["r"].shape
            (1000,)
        """
        sites = self._check_ready()
        if getattr(self, "_sampler", None) is None:   # one compile per guide
            self._sampler = jax.jit(jax.vmap(lambda k, p: self.simulate(k, p).choices.flat(),
                                             in_axes=(0, None)))
        p = {self.params_key: self.guide_params(params)}
        draws = self._sampler(jax.random.split(key, n), p)
        return {s.name: draws[s.addr] for s in sites}

    def quantiles(self, params: Any, qs: Sequence[float] | jax.Array, *,
                  key: jax.Array | None = None, num_samples: int = 4000) -> dict:
        """Per-site quantiles of the fitted guide (constrained space): {address:
        array with a leading axis len(qs)}. Monte Carlo here (`num_samples` draws with
        `key`, default key 0: the same call gives the same numbers). The Gaussian
        families compute them exactly where a site's bijector is elementwise (see
        `gv.auto_normal(...).quantiles`); `gv.auto_delta`'s are its point.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_flow(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> auto.quantiles(params, [0.05, 0.5, 0.95])["r"].shape
            (3,)
        """
        key = jax.random.key(0) if key is None else key
        draws = self.sample(key, params, num_samples)
        qs = jnp.asarray(qs)
        return {k: jnp.quantile(v, qs, axis=0) for k, v in draws.items()}

    def median(self, params: Any, *, key: jax.Array | None = None,
               num_samples: int = 4000) -> dict:
        """Per-site posterior median (constrained space): {address: value}; here the
        Monte Carlo 0.5 quantile of `quantiles` (same `key` and `num_samples`).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_flow(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> bool(auto.median(params)["r"] > 0)
            True
        """
        return {k: v[0] for k, v in self.quantiles(params, [0.5], key=key,
                                                   num_samples=num_samples).items()}

    def mean(self, params: Any, *, key: jax.Array | None = None,
             num_samples: int = 20000) -> dict:
        """Per-site mean of the fitted guide (constrained space), by Monte Carlo.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_normal(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> bool(auto.mean(params)["r"] > 0)
            True
        """
        key = jax.random.key(0) if key is None else key
        return {k: v.mean(0) for k, v in self.sample(key, params, num_samples).items()}


def split_flat(sites: list[Site], z: jax.Array) -> dict:
    """A flat unconstrained vector (last axis) split into {site name: flat block}."""
    out, i = {}, 0
    for s in sites:
        out[s.name] = z[..., i:i + s.size]
        i += s.size
    return out


def to_choices(sites: list[Site], values: dict) -> ChoiceMap:
    return ChoiceMap({s.addr: values[s.name] for s in sites})
