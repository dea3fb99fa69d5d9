"""Stage 2 of enumeration: the log density's factors, each a tensor over the summed
sites it depends on and the plates it lies in.

The density, evaluated with its sum kept apart (`genvi.inference.enumeration.evaluate.Terms`),
is read in two passes:

1. **What each term depends on** (`term_lanes`): the density is evaluated once per
   summed site with that site tracked (every lane at one value, a `Same`; the other
   sites at fixed values), abstractly: nothing of it is left in the program. A term
   comes out depending on the site lane by lane, the site's lanes at known axes of the
   term, or not depending on it; a term that mixes the site's lanes raises
   `NotSummable`, naming the primitive. Axes of terms and sites that meet are one
   plate (`_Plates`: a site's lanes and the observations made per lane of it, also in
   another `gv.vmap`). Sites of one value are followed through the terms' dependence.
2. **The terms' values** (`_term_values`): the terms that depend on one set of sites
   are evaluated at every joint value of those sites (every lane at the value) under
   `vmap`: a tensor [each site's support, the term's axes], whose axes that are no
   plate of a site are summed at once.

`sum_over_sites` hands them to the contraction (`genvi.inference.enumeration.contract`).

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x, y: jnp.sum(x) + jnp.sum(x * y))(1.0, 2.0)
    >>> term_dependence(closed, [1.0, 2.0])
    [{0}, {0, 1}]
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.inference.enumeration.contract import Factor, Plan, contract
from genvi.inference.enumeration.evaluate import evaluate, term_leaves, whole
from genvi.inference.enumeration.same import Same
from genvi.inference.enumeration.sites import MAX_JOINT, NotSummable, joint_values
from genvi.replays.engine import Local, is_tracked


def _terms(closed: Any, inputs: list) -> tuple:
    """The (leaf, coefficient) pairs of the density `closed` computes from `inputs`."""
    (out,) = evaluate(closed, inputs, lazy=True)
    return term_leaves(out)


def _every_lane(s: Any, value: Any, plain: bool = True) -> Any:
    """Site `s` at `value` in every lane, held once (a `Same`; `plain`: not tracked, so
    what reads it alone is computed once and no lanes are followed)."""
    if s.shape == ():
        return jnp.asarray(value, s.dtype)
    one = jnp.full((1,) * len(s.shape), value, s.dtype)
    return Same(one, tuple(range(len(s.shape))), tuple(s.shape), plain=plain)


def _placeholder(s: Any) -> Any:
    """A site's value where the terms evaluated do not depend on it: its first value."""
    return _every_lane(s, s.support[0])


def term_lanes(closed: Any, sites: list, flat_in: list) -> list[dict]:
    """Per term of the density: {site index: the term's axes of the site's lanes} for
    the sites it depends on (pass 1 of the module, evaluated abstractly). A site of
    one value (no lanes) is followed through the traced terms' dependence instead."""
    found: list = []
    batched = [i for i, s in enumerate(sites) if s.shape != ()]
    scalars = [i for i, s in enumerate(sites) if s.shape == ()]

    def run(flat_in: list) -> Any:
        for i in batched:
            s = sites[i]
            inputs = [_every_lane(t, t.support[0], plain=False) if j == i else _placeholder(t)
                      for j, t in enumerate(sites)]
            try:
                leaves = _terms(closed, inputs + list(flat_in))
            except NotSummable as why:
                raise NotSummable(f"{why} (site {s.name!r})") from None
            found.append((i, [_lanes_of(leaf, s) for leaf, _ in leaves]))
        return jnp.zeros(())
    jax.eval_shape(run, flat_in)
    if scalars:
        def values(scalar_values: list, flat_in: list) -> list:
            given = dict(zip(scalars, scalar_values))
            inputs = [given[i] if i in given else _placeholder(s) for i, s in enumerate(sites)]
            return [whole(leaf) * c for leaf, c in _terms(closed, inputs + list(flat_in))]
        traced = jax.make_jaxpr(values)([_placeholder(sites[i]) for i in scalars], flat_in)
        deps = jx.output_dependence(traced)
        found += [(i, [() if n in d else None for d in deps]) for n, i in enumerate(scalars)]
    counts = {len(f) for _, f in found}
    if len(counts) != 1:
        raise NotSummable("the density's terms differ by which site is tracked")
    return [{i: f[k] for i, f in sorted(found) if f[k] is not None}
            for k in range(counts.pop())]


def _lanes_of(leaf: Any, s: Any) -> tuple | None:
    if isinstance(leaf, Same):
        return None if leaf.plain else tuple(leaf.axes)
    if isinstance(leaf, Local):
        return tuple(leaf.axes)
    if is_tracked(leaf):
        raise NotSummable(f"their lanes couple in a term of site {s.name!r}")
    return None


class _Plates:
    """Plates as classes of (site, lane axis): a term's axis joins the lanes of every
    site it holds there (union-find)."""

    def __init__(self, sites: list):
        self.parent: dict = {}
        self.sites = sites

    def find(self, node: tuple) -> tuple:
        self.parent.setdefault(node, node)
        while self.parent[node] != node:
            node = self.parent[node]
        return node

    def union(self, a: tuple, b: tuple) -> None:
        self.parent[self.find(a)] = self.find(b)

    def name(self, label: tuple) -> str:
        """The plate as its own site's lanes (the site of fewest plates in it) and size."""
        i, j = min((node for node in self.parent if self.find(node) == label),
                   key=lambda node: (len(self.sites[node[0]].shape), node))
        s = self.sites[i]
        return f"{s.name}[{j}]:{s.shape[j]}" if len(s.shape) > 1 else f"{s.name}:{s.shape[0]}"


def sum_over_sites(closed: Any, sites: list, flat_in: list,
                   lanes_kept: int = 0) -> tuple[Any, Plan]:
    """log Σ over every site's values (lane by lane) of the density `closed` computes
    from (site values, *flat_in), and the contraction's plan. With `lanes_kept` = m,
    the plates of every site's first m axes are not multiplied out: the log comes as
    (a scalar, an array over those axes), as `contract` returns it."""
    lanes = term_lanes(closed, sites, flat_in)
    plates = _Plates(sites)
    for per_site in lanes:
        by_axis: dict = {}
        for i, axes in per_site.items():
            for j, a in enumerate(axes):
                by_axis.setdefault(a, []).append((i, j))
        for nodes in by_axis.values():
            for node in nodes[1:]:
                plates.union(nodes[0], node)
    site_plates = {i: frozenset(plates.find((i, j)) for j in range(len(s.shape)))
                   for i, s in enumerate(sites)}
    for i, s in enumerate(sites):
        if len(site_plates[i]) != len(s.shape):
            raise NotSummable(f"two lane axes of site {s.name!r} are one plate")
    scales = _plate_scales(sites, site_plates)
    groups: dict = {}
    for k, per_site in enumerate(lanes):
        groups.setdefault(tuple(sorted(per_site)), []).append(k)
    factors = []
    for deps, ks in groups.items():
        values, shapes = _term_values(closed, sites, flat_in, deps, ks)
        for k, v, shape in zip(ks, values, shapes):
            factors.append(_factor(v, shape, deps, lanes[k], plates, scales))
    names = {i: repr(s.name) for i, s in enumerate(sites)}
    names.update({label: plates.name(label) for label in scales})
    sizes = {label: sites[label[0]].shape[label[1]] for label in scales}
    keep = tuple(plates.find((0, j)) for j in range(lanes_kept))
    if any(plates.find((i, j)) != keep[j] for i in range(len(sites)) for j in range(lanes_kept)):
        raise NotSummable("the sites local to a step lie in different sequences' lanes")
    return contract(factors, site_plates, scales, names, sizes, keep)


def _plate_scales(sites: list, site_plates: dict) -> dict:
    """Each plate's scale (a subsampled gv.plate's size / lanes), from the sites'
    scales (the product of their plates'): the outer plates' first."""
    scales: dict = {}
    for i in sorted(site_plates, key=lambda i: len(site_plates[i])):
        known = math.prod(scales[p] for p in site_plates[i] if p in scales)
        new = sorted(p for p in site_plates[i] if p not in scales)
        if new:
            scales.update({p: 1.0 for p in new})
            scales[new[0]] = sites[i].scale / known
        elif not math.isclose(known, sites[i].scale):
            raise NotSummable(f"site {sites[i].name!r} lies in gv.plates of other scales than "
                              "the sites that share its plates")
    return scales


def _term_values(closed: Any, sites: list, flat_in: list, deps: tuple, ks: list) -> list:
    """The terms `ks` (which depend on the sites `deps`) at every joint value of those
    sites, every lane at the value: each [support of each site in deps, *term shape]."""
    on = [sites[i] for i in deps]
    count = math.prod(len(s.support) for s in on)
    if count > MAX_JOINT:
        raise NotSummable(f"the sites {[s.name for s in on]} meet in one term with "
                          f"{count:,} joint values (more than {MAX_JOINT:,}): put repeated "
                          "sites in a gv.plate or gv.scan, where they are summed lane by lane "
                          "or step by step")

    shapes: list = []  # each term's whole shape (its values may hold axes of size 1)

    def at(values: list) -> list:
        given = dict(zip(deps, values))
        # every lane at the value, held once and not tracked (pass 1 checked the
        # lanes): what depends on the value alone (a component's mean, a class's row of
        # a table) is computed once per value, as NumPyro's enumeration broadcasts a
        # value of shape (K, 1) against its plate
        inputs = [_every_lane(s, given[i]) if i in given else _placeholder(s)
                  for i, s in enumerate(sites)]
        every = _terms(closed, inputs + list(flat_in))
        leaves = [every[k] for k in ks]
        shapes[:] = [x.shape if isinstance(x, Same) else jnp.shape(whole(x))
                     for x, _ in leaves]
        return [_held(x) * c for x, c in leaves]
    if not deps:
        return at([]), shapes
    values = jax.vmap(at)(joint_values(on))
    shape = tuple(len(s.support) for s in on)
    return [jnp.reshape(v, shape + jnp.shape(v)[1:]) for v in values], shapes


def term_dependence(closed: Any, inputs: list) -> list[set]:
    """Per term of the density `closed` computes, the positions of the `inputs` it
    depends on (the module's example)."""
    def terms(*values: Any) -> list:
        return [jnp.sum(leaf) * c for leaf, c in _terms(closed, list(values))]
    return jx.output_dependence(jax.make_jaxpr(terms)(*inputs))


def terms_part(closed: Any, keep: list, first: list = (), n: int = 0) -> Any:
    """The sum of the terms `keep` of the density `closed` computes, as a closed jaxpr
    of the same inputs, but for the first `n` of them, whose positions `first` come
    first (then the rest of the `n` in order).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> closed = jax.make_jaxpr(lambda x, y: jnp.sum(x) + jnp.sum(x * y))(1.0, 2.0)
        >>> part = terms_part(closed, [1])
        >>> (value,) = evaluate(part, [3.0, 2.0])
        >>> float(value.total("a doctest"))
        6.0
    """
    avals, first = closed.in_avals, list(first)
    order = first + [i for i in range(n) if i not in first]
    dtype = closed.out_avals[0].dtype

    def part(*inputs: Any) -> Any:
        values = [None] * n
        for i, x in zip(order, inputs[:n]):
            values[i] = x
        leaves = _terms(closed, values + list(inputs[n:]))
        return sum((jnp.sum(leaves[k][0]) * leaves[k][1] for k in keep), jnp.zeros((), dtype))
    shapes = [jax.ShapeDtypeStruct(avals[i].shape, avals[i].dtype) for i in order]
    shapes += [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals[n:]]
    return jax.make_jaxpr(part)(*shapes)


def _held(x: Any) -> Any:
    """A term's values as held: one value along the axes where a plain `Same` repeats
    it (size 1 there), so a factor that does not vary by lane stays small."""
    return x.value if isinstance(x, Same) and x.plain else whole(x)


def _factor(values: Any, shape: tuple, deps: tuple, per_site: dict, plates: _Plates,
            scales: dict) -> Factor:
    """A term's values (whole `shape`, perhaps held at size 1 along some axes) as a
    `Factor`: its axes that are no site's lanes summed, the others labelled by plate,
    unscaled (`contract` scales each plate's product)."""
    n = len(deps)
    label_of = {}
    for i, axes in per_site.items():
        for j, a in enumerate(axes):
            label_of[a] = plates.find((i, j))
    ndim = jnp.ndim(values) - n
    free = tuple(a for a in range(ndim) if a not in label_of)
    if free:  # an axis held at size 1 stands for all of its entries
        repeats = math.prod(shape[a] // jnp.shape(values)[n + a] for a in free)
        values = jnp.sum(values, axis=tuple(n + a for a in free)) * repeats
    kept = [a for a in range(ndim) if a in label_of]
    labels = tuple(label_of[a] for a in kept)
    if len(set(labels)) != len(labels):
        raise NotSummable("a term holds one plate along two axes")
    scale = math.prod(scales[p] for p in labels)
    return Factor(values / scale if scale != 1.0 else values, deps, labels)
