"""`gv.to_arviz`: guide draws and `gv.predictive` output as ArviZ data: an
`xarray.DataTree` on ArviZ 1.x (through arviz-base), an `InferenceData` on ArviZ 0.x.

ArviZ is an optional dependency (`pip install 'genvi[arviz]'`), imported only when
called (`arviz_versions.require_arviz`). Draws are stacked choice maps (leading axis: the draws, as
`gv.predictive`, `guide.simulate` under `jax.vmap` and `Diagnosis.resample` give
them); they become one chain. A nested address `("data", "y")` becomes the variable
`"data.y"`: ArviZ writes its data to netCDF, whose names cannot hold a "/".
Given the model and its arguments, the model's named observations move to the
`posterior_predictive` (or `prior_predictive`) group and the axes that `gv.plate` / `gv.vmap` / `gv.scan` add
are named after the address of the combinator's call (`"data"` for a site at
`"data/z"` of `gv.plate(point, n)(...) @ "data"`).

Example:
    >>> import genvi as gv, jax, jax.numpy as jnp
    >>> @gv.gen
    ... def model(params, y):
    ...     mu = gv.normal(0.0, 1.0) @ "mu"
    ...     gv.observe(gv.normal(mu, 1.0), y, name="y")
    >>> y = jnp.array([0.3, -0.2, 0.9])
    >>> draws = gv.predictive(model, None, {}, num_samples=50)(jax.random.key(0), y)
    >>> idata = gv.to_arviz(draws, model=model, args=({}, y), observed_data={"y": y})
    >>> idata.posterior_predictive["y"].shape     # (chain, draw, observation)
    (1, 50, 3)
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from genvi.core.choices import ChoiceMap
from genvi.core.program_mistakes import require_program
from genvi.gen.combinators import Repeat, Scan, Vmap
from genvi.gen.language import GenFn
from genvi.gen.sites import deterministic_addresses, site_layouts, site_addresses
from genvi.inference.arviz_versions import require_arviz
from genvi.core.address import Address

SEPARATOR = "."  # joins the parts of a nested address in ArviZ names


def variable_name(path: tuple) -> str:
    """The ArviZ variable name of an address path: its parts joined by `"."`.

    Example:
        >>> from genvi.inference.arviz_export import variable_name
        >>> variable_name(("data", "y"))
        'data.y'
    """
    return SEPARATOR.join(map(str, path))


def address_path(key: Any) -> tuple:
    """An address as a path: `"data/y"` and `("data", "y")` both give `("data", "y")`.

    Example:
        >>> from genvi.inference.arviz_export import address_path
        >>> address_path("data/y"), address_path(("data", "y")), address_path("mu")
        (('data', 'y'), ('data', 'y'), ('mu',))
    """
    if isinstance(key, tuple):
        return key
    if isinstance(key, str):
        return Address.parse(key)
    raise TypeError(f"gv.to_arviz: addresses are strings such as \"y\" or \"data/y\", or "
                    f"tuples such as (\"data\", \"y\"); got {key!r}")


def flat_values(values: Any, what: str) -> dict:
    """`{path: numpy array}` of a choice map or a (nested) dict of arrays."""
    if isinstance(values, ChoiceMap):
        return {p: np.asarray(v) for p, v in values.flat().items()}
    if not isinstance(values, Mapping):
        raise TypeError(f"gv.to_arviz: {what} is a choice map or a dict of arrays keyed by "
                        f"address; got {type(values).__name__}")
    out: dict = {}

    def walk(prefix: tuple, d: Any) -> None:
        if isinstance(d, (Mapping, ChoiceMap)):
            items = d.flat().items() if isinstance(d, ChoiceMap) else d.items()
            for k, v in items:
                walk(prefix + address_path(k), v)
        else:
            out[prefix] = np.asarray(d)
    walk((), values)
    return out


def plate_dims(model: GenFn, args: tuple) -> tuple[dict, set]:
    """(`{path: dim names of the axes the combinators add}`, the paths of the model's
    named observations), read from the model's traced sites.

    Each combinator call adds one part to the address (its `@ "name"`) and one entry
    to the site's recorded nesting, so when a site's address prefix is as long as its
    nesting, the prefix parts name the axes, outermost first. Otherwise (a combinator
    directly inside another, or a model that is itself a combinator) the axes are left
    to ArviZ's default names.

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> from genvi.inference.arviz_export import plate_dims
        >>> @gv.gen
        ... def point(mu, y):
        ...     gv.observe(gv.normal(mu, 1.0), y, name="y")
        >>> @gv.gen
        ... def model(params, y):
        ...     mu = gv.normal(0.0, 1.0) @ "mu"
        ...     gv.plate(point, 3, in_axes=(None, 0))(mu, y) @ "data"
        >>> plate_dims(model, ({}, jnp.zeros(3)))
        ({('data', 'y'): ['data']}, {('data', 'y')})
    """
    jaxpr = model.jaxpr(*args)
    latents = site_addresses(jaxpr) | deterministic_addresses(jaxpr)
    dims, observed = {}, set()
    for path, (nest, _) in site_layouts(jaxpr).items():
        if path not in latents:
            observed.add(path)
        prefix = path[:-1]
        if nest and len(nest) == len(prefix) and not isinstance(model, (Vmap, Repeat, Scan)):
            dims[path] = [variable_name(prefix[:i + 1]) for i in range(len(prefix))]
    return dims, observed


def _dataset(values: dict, dims: dict, draws: bool) -> tuple[dict, dict]:
    """ArviZ's (data, dims) of `{path: array}`; with `draws`, arrays get a chain axis
    and must share their leading (draw) axis."""
    data, named = {}, {}
    lengths = {np.shape(v)[0] if np.ndim(v) else None for v in values.values()}
    if draws and (len(lengths) > 1 or None in lengths):
        shown = ", ".join(f"{variable_name(p)}: {np.shape(v)}" for p, v in values.items())
        raise ValueError(f"gv.to_arviz: draws are stacked on a leading axis of the same length "
                         f"for every address (as gv.predictive gives them); got shapes {shown}")
    for path, v in values.items():
        name = variable_name(path)
        data[name] = v[None] if draws else v
        if name in dims:
            named[name] = dims[name]
    return data, named


def _move_observations(draws: dict, predictive: dict, observed: set, names: tuple) -> None:
    """Move the model's named observations from `draws` to `predictive` (in place)."""
    for path in [p for p in draws if p in observed]:
        if path in predictive:
            raise ValueError(f"gv.to_arviz: the observation {variable_name(path)!r} is in both "
                             f"{names[0]}= and {names[1]}=; give it once")
        predictive[path] = draws.pop(path)


def to_arviz(posterior: Any = None, *, posterior_predictive: Any = None,
             observed_data: Any = None, prior: Any = None, prior_predictive: Any = None,
             model: GenFn | None = None, args: tuple = (), dims: Mapping | None = None,
             coords: Mapping | None = None) -> Any:
    """ArviZ data of draws (an `xarray.DataTree` on ArviZ 1.x, an `InferenceData` on
    0.x; `arviz.summary` and ArviZ's plots take either), with groups `posterior`, `posterior_predictive`,
    `observed_data`, `prior` and `prior_predictive` where given (one chain; draws along
    the `draw` dim).

    Draws are stacked on a leading axis: a choice map or dict of arrays keyed by
    address (`"mu"`, `"data/y"`, `("data", "y")` or nested dicts): `gv.predictive(...)`
    output, vmapped `guide.simulate(...).choices`, or `gv.diagnose(...).resample(key,
    n)` for `posterior`; `gv.predictive(model, None, ...)` output for `prior`.
    `observed_data` holds the data (no draw axis). Variables are named by address
    with `"."` between the parts (`"data.y"`).

    With `model` and `args` (the model's arguments, params first, as
    `gv.predictive` calls it) the model's named observations (not its
    `gv.deterministic` values, which stay in the posterior) found in `posterior`
    (`prior`) go to `posterior_predictive` (`prior_predictive`), and the axes added by
    `gv.plate`, `gv.vmap`, `gv.repeat` and `gv.scan` are named after the address of
    their call (see `plate_dims`); other axes get ArviZ's default names
    (`"theta_dim_0"`). `dims` (`{address or variable name: [dim names]}`, naming the
    axes after the draw axis) and `coords` (`{dim: labels}`) are passed to ArviZ and
    take precedence. Needs ArviZ (`pip install 'genvi[arviz]'`).

    Args:
        posterior: posterior draws stacked on a leading axis (a choice map or dict).
        posterior_predictive: posterior predictive draws.
        observed_data: the data (no draw axis).
        prior: prior draws.
        prior_predictive: prior predictive draws.
        model: the model, to sort observations from latents and name plate axes
            (optional).
        args: the model's arguments, params first.
        dims: names of the axes after the draw axis, per address or variable.
        coords: labels per dimension.

    Returns:
        an `xarray.DataTree` (ArviZ 1.x) or `InferenceData` (ArviZ 0.x).

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp, arviz as az
        >>> @gv.gen
        ... def guide(params):
        ...     gv.normal(params["m"], 1.0, grad=gv.REPARAM) @ "mu"
        >>> keys = jax.random.split(jax.random.key(0), 200)
        >>> draws = jax.vmap(lambda k: guide.simulate(k, {"m": 2.0}).choices)(keys)
        >>> idata = gv.to_arviz(draws)
        >>> idata.posterior["mu"].shape
        (1, 200)
    """
    az = require_arviz("gv.to_arviz")
    given = {"posterior": posterior, "posterior_predictive": posterior_predictive,
             "prior": prior, "prior_predictive": prior_predictive}
    if all(v is None for v in given.values()) and observed_data is None:
        raise ValueError("gv.to_arviz: give at least one of posterior=, posterior_predictive=, "
                         "observed_data=, prior= or prior_predictive=")
    require_program(model, "model", "gv.to_arviz(draws, model=model, args=...)", optional=True)
    auto_dims, observed = plate_dims(model, tuple(args)) if model is not None else ({}, set())
    values = {g: {} if v is None else flat_values(v, g) for g, v in given.items()}
    for draws, predictive in (("posterior", "posterior_predictive"),
                              ("prior", "prior_predictive")):
        _move_observations(values[draws], values[predictive], observed, (draws, predictive))
    values["observed_data"] = {} if observed_data is None else flat_values(observed_data,
                                                                          "observed_data")
    all_dims = {**{variable_name(p): d for p, d in auto_dims.items()},
                **{variable_name(address_path(k)): list(v) for k, v in (dims or {}).items()}}
    groups, group_dims = {}, {}
    for group, group_values in values.items():
        if group_values:
            groups[group], named = _dataset(group_values, all_dims, group != "observed_data")
            group_dims.update(named)
    return az.from_groups(groups, group_dims or None, None if coords is None else dict(coords))
