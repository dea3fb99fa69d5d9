"""RELAX (Grathwohl et al. 2018): a discrete site's score-function estimator with the
continuous relaxation as a control variate, `gv.RELAX(surrogate, phi)`, for sites
with a finite support: `gv.flip` and `gv.bernoulli` (a logistic relaxation) and
`gv.categorical` (a Gumbel-softmax relaxation).

With ℓ the site's logits per lane (binary: log p(1) − log p(0); categorical: the
normalized log-probabilities), b the value drawn, z a relaxed draw with b = H(z) and
z̃ a relaxed draw given b (both reparameterized in ℓ: z with its noise held, z̃ with
its conditional noise held and b fixed), the estimator of ∂/∂ℓ E f(b) is

    ĝ = (f(b) − c(z̃)) ∂ℓ log p(b) + ∂ℓ c(z) − ∂ℓ c(z̃),      c(z) = surrogate(phi, z)

Its mean is ∂ℓ E f(b) for any surrogate and any phi: E ∂ℓ c(z) = ∂ℓ E c(z) =
E c(z̃) ∂ℓ log p(b) + E ∂ℓ c(z̃) (REBAR's identity). So `phi` is free to minimize
the variance: in the same forward-mode estimator, the tangent along phi is
−½ ∂φ |ĝ|² (an unbiased estimate of −½ ∂φ Var ĝ, since E ĝ does not depend on phi),
so the step that ascends the objective in the model's and guide's parameters descends
the estimator's variance in phi, as a learned REINFORCE baseline is trained
(`gv.REINFORCE.with_baseline`). With the objective's own relaxation as the
surrogate (f evaluated at a tempered z, a scale and a temperature in phi) it is REBAR
(Tucker et al. 2017).

The surrogate sees the site's relaxed draw: in (0, 1) with the site's shape for a
binary site (σ(z) of the logistic variable z, > ½ exactly where b = 1), on the simplex
(last axis, the K values) for a categorical one (softmax(z)). With `logits=True` it
sees z itself: the logistic variable (> 0 exactly where b = 1), or the
log-probabilities plus Gumbels (argmax b; −∞ at a value of probability 0). A tempered
surrogate needs z (REBAR's σ(z / λ)): σ(z) rounds to 1 in float32 once z exceeds about
17, and a surrogate that inverts it to temper it then has an infinite derivative.
Everything it reads comes in `phi` (a pytree: the surrogate function is a static part
of the site), so a surrogate that uses the model (REBAR) takes the model's parameters
in `phi` behind `jax.lax.stop_gradient`, which keeps the variance gradient off them;
a differentiated parameter that reaches both `phi` and the objective is refused
(`genvi.adev.variance_training`).

Lane-local (the default where it is cheap). In a plate, f(b) is the whole
minibatch's objective, and a lane's score term f(b) ∂ℓᵢ log p(bᵢ) carries every other
lane's part of it as noise that a surrogate of lane i's relaxation cannot cancel. So
each lane also takes a replay baseline, f(b with lane i := b'ᵢ) for b' an independent
draw of the site, and the surrogate at the relaxation with lane i swapped,
c(z̃ with lane i := z̃'ᵢ) for z̃' given b':

    ĝᵢ = (f(b) − f(b₋ᵢ, b'ᵢ) − c(z̃) + c(z̃₋ᵢ, z̃'ᵢ)) ∂ℓᵢ log p(bᵢ) + ∂ℓᵢ c(z) − ∂ℓᵢ c(z̃).

Both added terms are independent of bᵢ, so their score terms have mean zero: still
unbiased for any surrogate. Where the objective is a sum over lanes the other lanes'
parts cancel exactly in f(b) − f(b₋ᵢ, b'ᵢ), and the surrogate cancels what it models
of lane i's part at bᵢ and at b'ᵢ. The replays are the lane-local ones MVD and RLOO use
(O(lanes) in plates, Markov-local in scans where the rest of the objective allows); a
lane whose b'ᵢ equals bᵢ has no replay. The surrogate runs once more per lane.
Where the rest of the objective couples the site's lanes, so that a lane's replay would
run it again (a decoder reading a latent vector), the default takes the papers' form,
without both terms: one evaluation of the rest of the objective. In a plate of latent
vectors, where it couples each datapoint's lanes but not the datapoints, the unit i
of both terms is a datapoint's vector, swapped whole (one lane-local replay per
datapoint, as `gv.DisARM`'s default pairs it).
`.whole_site()` and `.per_lane()` fix the form. The papers' form is also the better one
where lanes are few and the surrogate models f well (at a single flip a trained linear
surrogate leaves it 4% of its variance, the lane-local form 50%: b'ᵢ's noise stays).

b is the distribution's own draw with the site's key (replays of other sites see the
run's own value), and z is drawn given b, which is (b, z)'s joint law. f(b) enters as
a score term; the surrogate runs at z and z̃ with one reverse pass for its gradient in
ℓ, and where phi is differentiated, that pass's derivative along phi (a forward pass
over it).

Example:
    >>> import genvi as gv, jax, jax.numpy as jnp
    >>> def surrogate(phi, z):                 # a learned linear control variate
    ...     return jnp.sum(phi["w"] * z) + phi["b"]
    >>> @gv.expectation
    ... def e(p, phi):
    ...     x = gv.sample(gv.flip(p, grad=gv.RELAX(surrogate, phi)))
    ...     return jnp.where(x, 1.0, 3.0)
    >>> g = e.grad_estimate(jax.random.key(0), 0.3, {"w": 1.0, "b": 0.0})   # unbiased for −2
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.adev.continuation import reduce_to_lanes
from genvi.adev.finite import index_in_support
from genvi.adev.strategies.relax_parts import (BinaryRelaxation, CategoricalRelaxation, Terms,
                                               site_logits)
from genvi.core.strategy import Strategy, register_with_settings


@dataclass(frozen=True, eq=False)
class RELAX(Strategy):
    """RELAX at a finite-support site with the learned control variate
    `surrogate(phi, z)` (see the module docstring): `surrogate` is a function of
    `phi` (a pytree of arrays, from your params) and the relaxed draw `z` (σ / softmax
    of the logistic or Gumbel variable; that variable itself with `logits=True`),
    returning a float scalar. Under `gv.vmap` (a plate) it is applied lane by lane, as
    written. Each lane's score term has a lane-local replay baseline (each
    datapoint's, in a plate of latent vectors the rest reads jointly); `.whole_site()`
    drops it (the papers' form, one evaluation of the rest of the objective).

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> gv.RELAX(lambda phi, z: phi * jnp.sum(z), 1.0).kind
        'RELAX'
        >>> def rebar(phi, z):     # REBAR: f at z tempered by λ, on the logistic z
        ...     soft = jax.nn.sigmoid(z / phi["temperature"])
        ...     return phi["eta"] * jnp.sum((3.0 * soft - 1.0) ** 2)
        >>> gv.RELAX(rebar, {"eta": 0.8, "temperature": 0.5}, logits=True)
        gv.RELAX(rebar, phi, logits=True)
    """

    # a function once made: the default None is there for __post_init__'s clear refusal
    surrogate: Callable = None  # type: ignore[assignment]
    phi: Any = None
    # the surrogate sees z itself rather than σ(z) / softmax(z)
    logits: bool = False
    # the papers' form (no lane-local replay baseline): True, False (lane by lane), or
    # None: as `k.replay_units` decides
    whole: bool | None = dataclasses.field(default=None, kw_only=True)
    phi_tangent: Any = dataclasses.field(default=None, kw_only=True, repr=False)
    # phi's leaves' ranks as written (the static part's)
    ranks: tuple | None = dataclasses.field(default=None, kw_only=True, repr=False)
    kind = "RELAX"
    needs = ("sample", "lane_log_prob", "support")
    trains_operands = True  # phi descends the estimator's variance

    def __post_init__(self):
        if not callable(self.surrogate):
            raise TypeError(f"gv.RELAX(surrogate, phi) needs a function surrogate(phi, z) "
                            f"returning a float scalar; got {self.surrogate!r}")
        closed = [c.cell_contents for c in getattr(self.surrogate, "__closure__", None) or ()]
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(closed)):
            # it would leak: the estimator runs the surrogate in another trace
            raise TypeError(
                f"gv.RELAX: the surrogate {_name(self.surrogate)!r} closes over a traced value "
                "(a parameter of the objective, say); everything it reads must come in phi, "
                "e.g. gv.RELAX(surrogate, {'eta': params['eta']}) with surrogate(phi, z) "
                "reading phi['eta'] (REBAR's example in gv.RELAX's docstring)")
        if self.phi is None:
            raise TypeError("gv.RELAX(surrogate, phi): phi, the surrogate's parameters (a "
                            "pytree from your params, which gv.fit trains for the variance; "
                            "() for a surrogate without any), is missing")

    # phi travels as traced operands (its leaves); the surrogate, phi's structure and
    # its leaves' ranks are the static part
    def split(self):
        leaves, tree = jax.tree_util.tree_flatten(self.phi)
        # the ranks as written: a strategy joined from a batched site keeps them
        ranks = self.ranks if self.ranks is not None else tuple(jnp.ndim(x) for x in leaves)
        return dataclasses.replace(self, phi=tree, phi_tangent=None, ranks=ranks), tuple(leaves)

    def operand_event_ndims(self):
        return self.ranks or ()  # phi is not lane-shaped: its axes are its own

    def lane_operands(self, count):
        return (False,) * count  # under vmap phi gains the plates' axes, and no others

    def join(self, operands, tangents=None):
        phi = jax.tree_util.tree_unflatten(self.phi, list(operands))
        # leaves without a tangent (data, parameters behind stop_gradient) stay
        # symbolic zeros: the variance gradient does not differentiate them
        dphi = None
        if tangents is not None and any(t is not None for t in tangents):
            dphi = jax.tree_util.tree_unflatten(self.phi, list(tangents))
        return dataclasses.replace(self, phi=phi, phi_tangent=dphi)

    def whole_site(self) -> "RELAX":
        """RELAX without the lane-local replay baseline, always: every lane's score
        term multiplies f(b), one evaluation of the rest of the objective (Grathwohl et
        al.'s and REBAR's form, which the default takes where the rest couples the
        site's lanes). Across a plate's datapoints the default's baselines are
        lane-local and cancel the other datapoints' noise.

        Example:
            >>> import genvi as gv, jax.numpy as jnp
            >>> gv.RELAX(lambda phi, z: phi * jnp.sum(z), 1.0).whole_site().whole
            True
        """
        return dataclasses.replace(self, whole=True)

    def per_lane(self) -> "RELAX":
        """RELAX with the lane-local replay baseline, always, even where the rest of
        the objective couples the site's lanes and each lane's replay runs it again (one
        evaluation per lane, for less variance).

        Example:
            >>> import genvi as gv, jax.numpy as jnp
            >>> gv.RELAX(lambda phi, z: phi * jnp.sum(z), 1.0).per_lane().whole
            False
        """
        return dataclasses.replace(self, whole=False)

    def __hash__(self):
        return hash((type(self), self.surrogate, self.logits, self.whole))

    def __eq__(self, other):
        return (type(other) is type(self) and other.surrogate is self.surrogate
                and _static_tree(other.phi) == _static_tree(self.phi) and other.ranks == self.ranks
                and other.logits == self.logits and other.whole == self.whole)

    def __repr__(self) -> str:
        name = (f"gv.RELAX({_name(self.surrogate)}, phi"
                + (", logits=True)" if self.logits else ")"))
        return name + {None: "", True: ".whole_site()", False: ".per_lane()"}[self.whole]

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        b = dist.sample(key, *primals)
        if all(t is None for t in tangents) and self.phi_tangent is None:
            return k.dual(b)
        units = self._replay_units(k, b)
        whole = units is None
        binary = getattr(dist, "binary", False) is True
        logits, dlogits = d.jvp(lambda *p: site_logits(dist, b, binary, *p), primals, tangents)
        # the relaxations index the support: b's position in it, not b itself
        support = dist.support(*primals)
        relax = (BinaryRelaxation if binary else CategoricalRelaxation)(index_in_support(support, b))
        # z: drawn given b, then reparameterized with its noise held; z̃: given b
        noise = relax.noise(logits, relax.uniforms(jax.random.fold_in(key, 1), logits))
        v_tilde = relax.uniforms(jax.random.fold_in(key, 2), logits)
        # the replay baseline's draw b', independent of b, and its relaxation z̃' given b'
        other = relax_other = v_other = None
        if not whole:
            other = self.baseline_draw(dist, key, primals)
            relax_other = type(relax)(index_in_support(support, other))
            v_other = relax.uniforms(jax.random.fold_in(key, 4), logits)
        try:
            cv, d_cv = self._surrogate_terms(relax, relax_other, logits, noise, v_tilde, v_other,
                                             units)
        except _NotAScalar as err:
            raise TypeError(f"{err} (the site {k.address!r}, gv.{dist.name})") from None

        # the lanes that run (a site in an untaken branch of a batched cond: none)
        running = dist.where(jnp.ones(b.shape, bool)) if getattr(dist, "is_masked", False) else True
        running = jnp.broadcast_to(running, b.shape)
        # a unit where b' equals b has f(b₋ᵢ, b'ᵢ) = f(b): no score term and no replay
        replayed = (None if units is None
                    else reduce_to_lanes((other != b) & running, units, jnp.any))
        terms = Terms(relax, logits, running, replayed)
        score, replay, offset = terms.along_logits(cv, dlogits)
        if d_cv is not None:
            more_score, more_replay, more_offset = terms.along_phi(cv, d_cv)
            score, replay = d.add(score, more_score), d.add(replay, more_replay)
            offset = d.add(offset, more_offset)
        out = k.dual(b).plus(score=score, tangent=offset)
        if replay is None:
            return out
        # replay terms come only with the replay baseline (b' and the lanes it replays)
        assert other is not None and replayed is not None
        return out.plus_replays(other[None], replay[None], replayed[None], lane_axes=units)

    def _replay_units(self, k, b) -> int | None:
        """How many leading axes of b index the units that take a replay baseline each
        (all: lane by lane; the plates': each datapoint's vector whole), or None for
        the papers' form; `k.replay_units` decides the default, as `gv.DisARM`'s."""
        if self.whole is not None:
            return None if self.whole else b.ndim
        units = k.replay_units(b)
        if units is None:
            k.note("the papers' form, no replay baseline: the rest couples the lanes "
                   "(a lane's replay would run it again)")
        return units

    def _surrogate_terms(self, relax, relax_other, logits, noise, v_tilde, v_other, units):
        """(∂ℓ Σ (c(z) − c(z̃)), c(z̃) per plate lane, c(z̃ with unit := z̃') per replay
        unit or None), and their tangents along phi (None where phi has none)."""
        leaves, tree = jax.tree_util.tree_flatten(self.phi)
        plated = jnp.ndim(leaves[0]) - self.ranks[0] if leaves and self.ranks else 0  # vmap axes

        def pieces(*phi_leaves):
            phi = jax.tree_util.tree_unflatten(tree, phi_leaves)

            def differences(ell):
                diff, at_z_tilde = self.control_variates(phi, relax, ell, noise, v_tilde, plated)
                swapped = None if relax_other is None else self.swapped_control_variates(
                    phi, relax, relax_other, ell, v_tilde, v_other, plated, units)
                return jnp.sum(diff), (at_z_tilde, swapped)
            grad_cv, (at_z_tilde, swapped) = jax.grad(differences, has_aux=True)(logits)
            return grad_cv, at_z_tilde, swapped
        leaves_t = (None if self.phi_tangent is None else tree.flatten_up_to(self.phi_tangent))
        return d.jvp(pieces, leaves, [None] * len(leaves) if leaves_t is None else leaves_t)

    def baseline_draw(self, dist, key, primals):
        """The lane-local baseline's values b': a draw of the site independent of b."""
        return dist.sample(jax.random.fold_in(key, 3), *primals)

    def control_variates(self, phi, relax, ell, noise, v_tilde, plated=0):
        """(c(z(ℓ)) − c(z̃(ℓ)), c(z̃(ℓ))) per lane of the `plated` leading axes: z with
        its noise held, z̃ given b."""
        c = self._c
        for _ in range(plated):
            c = jax.vmap(c)
        at_z = c(phi, self._seen(relax, relax.reparameterized(ell, noise)))
        at_z_tilde = c(phi, self._seen(relax, relax.given_b(ell, v_tilde)))
        return at_z - at_z_tilde, at_z_tilde

    def swapped_control_variates(self, phi, relax, relax_other, ell, v_tilde, v_other,
                                 plated=0, units=None):
        """Per replay unit i of the site (a lane, or with `units` fewer than the lanes'
        axes a datapoint's vector): c(z̃ with unit i := z̃'ᵢ), z̃ given b and z̃' given
        b'. Independent of bᵢ, so c(...) ∂ℓᵢ log p(bᵢ) has mean zero; with the replay
        f(b₋ᵢ, b'ᵢ) it cancels what the surrogate models of f at b'ᵢ."""
        z_tilde = self._seen(relax, relax.given_b(ell, v_tilde))
        z_other = self._seen(relax_other, relax_other.given_b(ell, v_other))
        lanes = z_tilde.ndim - relax.simplex_axes
        swapped = (lanes if units is None else units) - plated  # the units' axes in a plate lane

        def per_plate_lane(phi, zt, zo):
            event = zt.shape[:swapped]
            size = math.prod(event)

            def swap(i):
                at = (jnp.arange(size) == i).reshape(event + (1,) * (zt.ndim - swapped))
                return self._c(phi, jnp.where(at, zo, zt))
            return jax.vmap(swap)(jnp.arange(size)).reshape(event)
        for _ in range(plated):
            per_plate_lane = jax.vmap(per_plate_lane)  # phi too: it has the plate axes
        return per_plate_lane(phi, z_tilde, z_other)

    def _seen(self, relax, z):
        """What the surrogate is handed of a relaxed draw: z, or its σ / softmax."""
        return z if self.logits else relax.relaxed(z)

    def _c(self, phi, z):
        out = self.surrogate(phi, z)
        if jnp.shape(out) != () or not jnp.issubdtype(jnp.result_type(out), jnp.floating):
            raise _NotAScalar(
                f"gv.RELAX: the surrogate {_name(self.surrogate)!r} must "
                f"return a float scalar (the control variate c(z) of the whole site); it "
                f"returned {jnp.result_type(out)}{list(jnp.shape(out))}. Sum over lanes "
                "inside it.")
        return out


class _NotAScalar(TypeError):
    """A surrogate that returned other than a float scalar (`jvp` adds the site)."""


def _name(surrogate: Callable) -> str:
    return getattr(surrogate, "__name__", "surrogate")


def _static_tree(phi: Any) -> Any:
    """phi's structure: a treedef once split, else the pytree's."""
    return phi if isinstance(phi, jax.tree_util.PyTreeDef) else jax.tree_util.tree_structure(phi)


register_with_settings("RELAX(surrogate, phi)", RELAX.needs)
