"""NumPyro's effects as genvi statements: the messenger under which a NumPyro function
runs inside a genvi program (`gv.from_numpyro`).

NumPyro sends every `numpyro.sample`, `param`, `deterministic`, `plate` and
`contrib.control_flow.scan` as a message down its handler stack. `GenviEffects` sits at
the bottom of that stack, so the model's own handlers (plates, `mask`, `scale`,
`condition`, `substitute`, `block`, `reparam`) have had their say when it answers:

* a latent `sample` becomes a genvi site at the NumPyro name, its distribution wrapped
  (`genvi.interop.numpyro_distributions`): the value is the site's, the strategy from the
  site's `infer={"grad": ...}` or the program's `strategies=`; an observed one (`obs=`,
  `condition`, `substitute`) a named observation; `numpyro.factor` an unnamed one;
* a plate's scale (size / subsample_size) and a static `handlers.scale` bracket the site
  with `gv.plate`'s scale markers; a plate's dimensions that lead the value are its
  lanes (`batch_axes`); a plate's random subsample is a site at the plate's name;
* `param` reads the program's `params` argument, `deterministic` is `gv.deterministic`;
* `scan` is a `jax.lax.scan` whose steps run the body under a fresh messenger, each
  step's sites stacked at their NumPyro names as `gv.scan`'s are.

What genvi cannot honour is refused naming the site in NumPyro's terms.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as nd
from numpyro import handlers as nh
from numpyro.primitives import Messenger

from genvi.adev.strategies import REINFORCE
from genvi.core import jaxpr as jx
from genvi.core.address import Address
from genvi.core.addressing import current_prefix, nested, prefixed, sample_site
from genvi.core.primitives import scaled_by
from genvi.distributions.base import DistCall
from genvi.interop.numpyro_distributions import wrap
from genvi.interop.numpyro_sites import KeyDraw, Subsample
from genvi.interop.numpyro_internals import (answer_scan, handlers_above, is_scan,
                                             plate_sizes, read_scan, sample_shape)
from genvi.gen.observations import deterministic, factor, observe
from genvi.guides.params import Constrained


# a site's line in messages is the user's numpyro.sample, not NumPyro's handler stack
jx.not_the_users(numpyro.__file__)


class NumPyroError(ValueError):
    """A NumPyro construct that genvi cannot run as written, named with the fix."""


@contextlib.contextmanager
def _under(name: str) -> Iterator[str]:
    """The last part of a NumPyro name, traced under the others as address prefixes
    (`handlers.scope` names sites "outer/inner", genvi's nested address)."""
    *outer, last = Address.parse(name)
    if not outer:
        yield name
        return
    with prefixed(current_prefix(f"numpyro site {name!r}") + tuple(outer)):
        yield last


def _static_scale(scale: Any) -> float | None:
    """A scale known when the program is traced, as a Python float (1.0 for None);
    None for a traced scale or one per lane."""
    if scale is None:
        return 1.0
    try:
        return float(np.asarray(scale).item())
    except (ValueError, TypeError, jax.errors.ConcretizationTypeError,
            jax.errors.TracerArrayConversionError):
        return None


def _leading_plate_axes(msg: dict, fn: Any) -> int:
    """How many leading axes of the site's value are plate dimensions (lanes)."""
    batch = len(fn.batch_shape)
    positions = {batch + f.dim for f in msg.get("cond_indep_stack") or ()
                 if -batch <= f.dim < 0}
    k = 0
    while k in positions:
        k += 1
    return k


def _step_value(data: Any, msg: dict, i: Any, length: int) -> Any:
    """A `condition`/`substitute` around a scan, read at step `i`: the value given for
    the whole sequence, sliced along its leading (time) axis."""
    value = data(msg) if callable(data) else data.get(msg["name"])
    if value is None:
        return None
    if jnp.ndim(value) == 0 or jnp.shape(value)[0] != length:
        raise NumPyroError(
            f"the value given for {msg['name']!r} around contrib.control_flow.scan has shape "
            f"{jnp.shape(value)}: give the whole sequence, with the {length} steps on the "
            "leading axis, as NumPyro's scan stacks a site's values")
    return jnp.asarray(value)[i]


class GenviEffects(Messenger):
    """The bottom of NumPyro's handler stack inside a genvi program (see the module
    docstring): `params` are the program's parameters (`numpyro.param` reads them),
    `strategies` a strategy for every latent site or a dict by NumPyro name, `program`
    the program's name for messages.

    Example:
        >>> import genvi as gv, numpyro, numpyro.distributions as nd
        >>> def model():
        ...     numpyro.sample("z", nd.Normal(0.0, 1.0))
        >>> program = gv.from_numpyro(model)          # runs `model` under GenviEffects
        >>> sorted(program.simulate(jax.random.key(0), {}).choices.flat())
        [('z',)]
    """

    def __init__(self, params: Mapping, strategies: Any, program: str):
        super().__init__()
        self.params, self.strategies, self.program = params, strategies, program
        self.named: set = set()   # the NumPyro names `strategies` was asked about
        self.keys = 0   # numpyro.prng_key() calls so far: each is a site of its own

    def process_message(self, msg: dict) -> None:
        kind = msg["type"]
        if kind == "sample":
            self._sample(msg)
        elif kind == "param":
            self._param(msg)
        elif kind == "deterministic":
            with _under(msg["name"]) as leaf:
                msg["value"] = deterministic(leaf, msg["value"])
        elif kind == "plate":
            self._plate(msg)
        elif kind == "control_flow":
            self._scan(msg)
        elif kind == "prng_key":
            msg["value"] = self._key()
        elif kind == "mutable":
            raise NumPyroError(
                f"{self.program}: numpyro.mutable({msg['name']!r}) keeps state across calls, "
                "which a genvi program (a pure function of its parameters and arguments) "
                "cannot: pass the state in as an argument and return it.")

    # -- sample -----------------------------------------------------------------------
    def _sample(self, msg: dict) -> None:
        name, fn = msg["name"], msg["fn"]
        infer = msg.get("infer") or {}
        if infer.get("enumerate") not in (None, "parallel"):
            raise NumPyroError(
                f"numpyro site {name!r}: infer={{'enumerate': {infer['enumerate']!r}}} is "
                "not run by genvi; gv.marginal(program, keep, gv.enumeration()) sums a "
                "model's discrete sites in parallel, exactly (mark them 'parallel', or "
                "leave the mark out)")
        shape = sample_shape(msg)
        if shape:
            fn = fn.expand(shape + tuple(fn.batch_shape))
        scale = _static_scale(msg.get("scale"))
        observed = msg.get("is_observed") or msg["value"] is not None
        if scale is None and not observed:
            raise NumPyroError(
                f"numpyro site {name!r} ({type(fn).__name__}) is a latent under a scale "
                "that is traced or differs by lane (numpyro.handlers.scale): genvi scales a "
                "latent site's density by a number fixed when the program is traced, as a "
                "plate's size / subsample_size. Pass a Python float, or scale the "
                "observations instead.")
        with _under(name) as leaf:
            if not observed:
                assert scale is not None  # a latent under a traced scale was refused above
                with scaled_by(scale):
                    msg["value"] = self._latent(msg, leaf, fn, infer)
            elif scale is None:   # per-lane weights on an observation: its weighted density
                factor(jnp.asarray(msg["scale"]) * fn.log_prob(msg["value"]))
            else:
                dist, params = wrap(fn)
                auxiliary = infer.get("is_auxiliary") or type(fn) is nd.Unit
                with scaled_by(scale):   # numpyro.factor: an unnamed weight, no datum
                    observe(dist(*params), msg["value"], name=None if auxiliary else leaf)

    def _latent(self, msg: dict, leaf: str, fn: Any, infer: dict) -> Any:
        dist, params = wrap(fn)
        strategy = self._strategy(msg["name"], infer)
        call = DistCall(dist, params, strategy)
        return sample_site(call, leaf, batch_axes=_leading_plate_axes(msg, fn),
                           auxiliary=bool(infer.get("is_auxiliary")))

    def _strategy(self, name: str, infer: dict) -> Any:
        """The program's `strategies=` entry for `name`, else the site's
        `infer={"grad": ...}`, else the program's one strategy for every site."""
        if isinstance(self.strategies, Mapping):
            self.named.add(name)
            if name in self.strategies:
                return self.strategies[name]
            return infer.get("grad")
        return infer.get("grad", self.strategies)

    # -- param, plate ----------------------------------------------------------------
    def _param(self, msg: dict) -> None:
        name = msg["name"]
        if name not in self.params:
            given = sorted(map(str, self.params)) if isinstance(self.params, Mapping) else []
            raise KeyError(
                f"numpyro.param({name!r}) in {self.program}: the params given hold no "
                f"{name!r} (they hold {given}). Start from the program's own initial values, "
                f"params = program.init(key, *args), which runs {self.program} as NumPyro "
                "does and reads every numpyro.param's initial value and constraint.")
        value = self.params[name]
        msg["value"] = value.value if isinstance(value, Constrained) else value

    def _key(self) -> Any:
        """A key for `numpyro.prng_key()` (dropout, a network's own randomness): drawn
        at an auxiliary site of its own (`_prng_key_0`, ...: not a choice), with no
        density and no gradient term, so it is randomness the objective averages over."""
        leaf = f"_prng_key_{self.keys}"
        self.keys += 1
        call = DistCall(KeyDraw(), (jnp.zeros((), jnp.int8),), REINFORCE)
        return jax.random.wrap_key_data(sample_site(call, leaf, auxiliary=True))

    def _plate(self, msg: dict) -> None:
        if msg["value"] is not None:   # the whole plate, or a subsample given by substitute
            return
        size, count = plate_sizes(msg)
        with _under(msg["name"]) as leaf:
            call = DistCall(Subsample(size, count), (jnp.zeros((), jnp.int8),), REINFORCE)
            msg["value"] = sample_site(call, leaf)

    # -- contrib.control_flow.scan ---------------------------------------------------
    def _scan(self, msg: dict) -> None:
        if not is_scan(msg):
            raise NumPyroError(f"{self.program}: a NumPyro control-flow primitive other than "
                               "contrib.control_flow.scan is not run by genvi")
        f, init, xs, length, reverse, subs = read_scan(msg)
        if any(kind not in ("condition", "substitute") for kind, _ in subs):
            raise NumPyroError(f"{self.program}: numpyro.handlers.replay around "
                               "contrib.control_flow.scan is not run by genvi; a genvi "
                               "objective replays the guide's choices itself")
        self._check_outer_handlers()
        if length is None:
            length = int(jnp.shape(jax.tree_util.tree_leaves(xs)[0])[0])
        inner = GenviEffects(self.params, self.strategies, self.program)

        def step(state: tuple, x: Any) -> tuple:
            i, carry = state
            body = f
            for kind, data in subs:
                def given(m: dict, data: Any = data) -> Any:
                    return _step_value(data, m, i, length)
                body = (nh.condition if kind == "condition" else nh.substitute)(
                    body, **{f"{kind}_fn": given})
            # outer handlers see none of a step's sites, as under NumPyro's scan
            with nh.block(), inner:
                carry, y = body(carry, x)
            return (i + 1, carry), y

        (_, carry), ys = jax.lax.scan(nested("scan", step), (jnp.asarray(0), init), xs,
                                      length=length, reverse=reverse)
        self.named |= inner.named
        # nothing for NumPyro's scan to send again: the steps' sites are genvi's already
        answer_scan(msg, length, carry, ys)

    def _check_outer_handlers(self) -> None:
        """Refuse a mask or scale around a scan (they would not reach its steps' sites)."""
        for handler in handlers_above(self):
            if isinstance(handler, (nh.mask, nh.scale)):
                raise NumPyroError(
                    f"{self.program}: numpyro.handlers.{type(handler).__name__} around "
                    "contrib.control_flow.scan: genvi runs the scan's steps apart from the "
                    f"handlers around it; put the {type(handler).__name__} inside the "
                    "scanned function")

    def check_strategies(self) -> None:
        """After a run: every name in a `strategies=` dict is a latent site."""
        if isinstance(self.strategies, Mapping):
            unknown = set(map(str, self.strategies)) - self.named
            if unknown:
                raise KeyError(f"gv.from_numpyro({self.program}, strategies=...): "
                               f"{sorted(unknown)} name no latent numpyro.sample site; its "
                               f"latent sites are {sorted(self.named)}")
