"""Stage 2: the log density's factors, each a tensor over the summed sites it depends
on and the plates it lies in, read from its `Terms` and contracted (`sum_over_sites`):
`term_lanes` finds abstractly which sites each term depends on, lane by lane along
which axes (one plate where terms and sites meet: `_Plates`); `_term_values` evaluates
the terms at every joint value of their sites under `vmap`.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x, y: jnp.sum(x) + jnp.sum(x * y))(1.0, 2.0)
    >>> term_dependence(closed, [1.0, 2.0])
    [{0}, {0, 1}]
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.inference.enumeration.contract import Factor, Plan, contract
from genvi.inference.enumeration.evaluate import evaluate, term_leaves, whole
from genvi.inference.enumeration.same import Same, every_lane
from genvi.inference.enumeration.sites import MAX_JOINT, NotSummable, joint_values
from genvi.replays.engine import Local, is_tracked


def _terms(closed: Any, inputs: list, output: int = 0) -> tuple:
    """The (leaf, coefficient) pairs of output `output` of `closed` at `inputs`."""
    return term_leaves(evaluate(closed, inputs, lazy=True)[output])


def _placeholder(s: Any) -> Any:
    """A site's value where the terms evaluated do not depend on it: its first value."""
    return every_lane(s.support[0], s.shape, s.dtype, plain=True)


def term_lanes(closed: Any, sites: list, flat_in: list) -> list[dict]:
    """Per term of the density: {site index: the term's axes of the site's lanes}."""
    found: list = []
    batched = [i for i, s in enumerate(sites) if s.shape != ()]
    scalars = [i for i, s in enumerate(sites) if s.shape == ()]

    def run(flat_in: list) -> Any:
        for i in batched:
            s = sites[i]
            inputs = [every_lane(t.support[0], t.shape, t.dtype, plain=j != i)
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
    if isinstance(leaf, Local) or isinstance(leaf, Same) and not leaf.plain:
        return tuple(leaf.axes)
    if is_tracked(leaf) and not isinstance(leaf, Same):
        raise NotSummable(f"their lanes couple in a term of site {s.name!r}")
    return None


class _Plates:
    """Plates: the classes of (site, lane axis) that a term's axis joins (union-find)."""

    def __init__(self, sites: list, lanes: list):
        self.parent: dict = {}
        self.sites = sites
        for per_site in lanes:
            by_axis: dict = {}
            for i, axes in per_site.items():
                for j, a in enumerate(axes):
                    by_axis.setdefault(a, []).append((i, j))
            for first, *rest in by_axis.values():
                for node in rest:
                    self.parent[self.find(first)] = self.find(node)

    def find(self, node: tuple) -> tuple:
        self.parent.setdefault(node, node)
        while self.parent[node] != node:
            node = self.parent[node]
        return node

    def name(self, label: tuple) -> str:
        """The plate as its own site's lanes (the site of fewest plates in it) and size."""
        i, j = min((node for node in self.parent if self.find(node) == label),
                   key=lambda node: (len(self.sites[node[0]].shape), node))
        s = self.sites[i]
        return f"{s.name}[{j}]:{s.shape[j]}" if len(s.shape) > 1 else f"{s.name}:{s.shape[0]}"


def sum_over_sites(closed: Any, sites: list, flat_in: list,
                   lanes_kept: int = 0) -> tuple[Any, Plan]:
    """log Σ over the sites' values of the density `closed` (of site values, *flat_in),
    and the plan; the plates of the sites' first `lanes_kept` axes are kept."""
    lanes = term_lanes(closed, sites, flat_in)
    plates = _Plates(sites, lanes)
    site_plates = {i: frozenset(plates.find((i, j)) for j in range(len(s.shape)))
                   for i, s in enumerate(sites)}
    for i, s in enumerate(sites):
        if len(site_plates[i]) != len(s.shape):
            raise NotSummable(f"two lane axes of site {s.name!r} are one plate")
    scales: dict = {}   # each plate's (a subsampled gv.plate's size / lanes), from the sites'
    for i in sorted(site_plates, key=lambda i: len(site_plates[i])):
        known = math.prod(scales[p] for p in site_plates[i] if p in scales)
        new = sorted(p for p in site_plates[i] if p not in scales)
        if new:
            scales.update({p: 1.0 for p in new})
            scales[new[0]] = sites[i].scale / known
        elif not math.isclose(known, sites[i].scale):
            raise NotSummable(f"site {sites[i].name!r} lies in gv.plates of other scales than "
                              "the sites that share its plates")
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


def _term_values(closed: Any, sites: list, flat_in: list, deps: tuple,
                 ks: list) -> tuple[list, list]:
    """The terms `ks` (of the sites `deps`) at every joint value of those sites, every
    lane at the value: each [support of each site in deps, *term shape]."""
    on = [sites[i] for i in deps]
    shape = tuple(len(s.support) for s in on)
    count = math.prod(shape)
    if count > MAX_JOINT:
        raise NotSummable(f"the sites {[s.name for s in on]} meet in one term with {count:,} joint "
                          f"values (more than {MAX_JOINT:,}): put repeated sites in a gv.plate or "
                          "gv.scan, where they are summed lane by lane or step by step")

    shapes: list = []  # each term's whole shape (its values may hold axes of size 1)

    def at(values: list) -> list:
        given = dict(zip(deps, values))
        # every lane at the value, not tracked: pass 1 checked the lanes
        inputs = [every_lane(given[i], s.shape, s.dtype, plain=True) if i in given
                  else _placeholder(s) for i, s in enumerate(sites)]
        every = _terms(closed, inputs + list(flat_in))
        leaves = [every[k] for k in ks]
        shapes[:] = [x.shape if isinstance(x, Same) else jnp.shape(whole(x))
                     for x, _ in leaves]
        # a plain `Same` held at size 1 where it repeats a value: a factor stays small
        return [(x.value if isinstance(x, Same) and x.plain else whole(x)) * c
                for x, c in leaves]
    if not deps:
        return at([]), shapes
    values = jax.vmap(at)(joint_values(on))
    return [jnp.reshape(v, shape + jnp.shape(v)[1:]) for v in values], shapes


def term_dependence(closed: Any, inputs: list, output: int = 0) -> list[set]:
    """Per term of output `output` of `closed`, the positions of the `inputs` it reads."""
    def terms(*values: Any) -> list:
        return [jnp.sum(leaf) * c for leaf, c in _terms(closed, list(values), output)]
    return jx.output_dependence(jax.make_jaxpr(terms)(*inputs))


def terms_part(closed: Any, keep: list, first: Sequence[int] = (), n: int = 0,
               output: int = 0) -> Any:
    """The sum of the terms `keep` of the density `closed` computes (output `output`),
    as a closed jaxpr of the same inputs, but for the first `n` of them, whose
    positions `first` come first (then the rest of the `n` in order).

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
    dtype = closed.out_avals[output].dtype

    def part(*inputs: Any) -> Any:
        placed = dict(zip(order, inputs))
        leaves = _terms(closed, [placed[i] for i in range(n)] + list(inputs[n:]), output)
        return sum((jnp.sum(leaves[k][0]) * leaves[k][1] for k in keep), jnp.zeros((), dtype))
    shapes = [jax.ShapeDtypeStruct(avals[i].shape, avals[i].dtype) for i in order]
    shapes += [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals[n:]]
    return jax.make_jaxpr(part)(*shapes)


def _factor(values: Any, shape: tuple, deps: tuple, per_site: dict, plates: _Plates,
            scales: dict) -> Factor:
    """A term's values (whole `shape`, held at size 1 along some axes) as an unscaled
    `Factor`: its axes that are no site's lanes summed, the others labelled by plate."""
    n = len(deps)
    label_of = {a: plates.find((i, j)) for i, axes in per_site.items() for j, a in enumerate(axes)}
    ndim = jnp.ndim(values) - n
    free = tuple(a for a in range(ndim) if a not in label_of)
    if free:  # an axis held at size 1 stands for all of its entries
        repeats = math.prod(shape[a] // jnp.shape(values)[n + a] for a in free)
        values = jnp.sum(values, axis=tuple(n + a for a in free)) * repeats
    labels = tuple(label_of[a] for a in range(ndim) if a in label_of)
    if len(set(labels)) != len(labels):
        raise NotSummable("a term holds one plate along two axes")
    scale = math.prod(scales[p] for p in labels)
    return Factor(values / scale if scale != 1.0 else values, deps, labels)
