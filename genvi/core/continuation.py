"""The public, typed protocol of the continuation a strategy's rule receives.

`Strategy.jvp(dist, key, primals, tangents, k)` gets `k`, the rest of the objective
after its site. `Continuation` names every member a rule may use; the ADEV
interpreter (`genvi.adev.interpreter`) implements it, and a strategy written against
this protocol alone is a plugin: nothing else in genvi changes when it lands. What
`k.dual(...)` returns is a `Continued`: the site's value with the terms the rule adds
to the final tangent.

The members, in the order a rule usually needs them (each is documented, with an
example, in `docs/extending.md`):

* `dual(value, tangent=None)` continues in place with the site's value (and its
  tangent, for a pathwise rule); `.plus(score=, tangent=)` and
  `.plus_replays(alternatives, weights, live, lane_axes=)` on the result add terms.
* `pure(value)` is the rest's value with the site's value replaced (one replay).
* `can_branch` / `dual_map(values)`: the dual rest at several values, at top level.
* `lanes_couple(value, lane_axes=None)`, `replay_units(value)`, `batch_axes`: what
  lane-by-lane replays of the site would cost, to choose a rule's form.
* `address`, `location`: where the site is, for messages and for run state.
* `state(strategy)`: the run's `RunState` of a strategy that keeps one.
* `note(path)`: say how the site's terms are evaluated (shown by `gv.explain`).
* `resolved(result)`: a result with its replays evaluated now.

Example:
    >>> import genvi as gv, jax
    >>> class Pathwise(gv.Strategy):
    ...     kind, needs, pathwise = "PATHWISE", ("sample", "reparameterized"), True
    ...     def jvp(self, dist, key, primals, tangents, k: gv.Continuation) -> gv.Continued:
    ...         x, dx = gv.dual.jvp(lambda *p: dist.sample(key, *p), primals, tangents)
    ...         return k.dual(x, dx)
    >>> @gv.expectation
    ... def e(m):
    ...     return gv.sample(gv.normal(m, 1.0, grad=Pathwise())) ** 2
    >>> float(e.grad_estimate(jax.random.key(0), 1.0)) != 0.0
    True
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Continued(Protocol):
    """What `Continuation.dual` returns and a rule returns in turn: the site's value
    and its tangent, with terms added to the final tangent (`score` × the objective's
    value, plus `offset`) and replays left for the replay engine to evaluate.

    Example:
        >>> import jax.numpy as jnp
        >>> from genvi.adev.continuation import Deferred
        >>> isinstance(Deferred(jnp.zeros(2)).plus(score=1.0), Continued)
        True
    """

    value: Any
    tangent: Any

    def plus(self, score: Any = None, tangent: Any = None) -> "Continued":
        """Add `score × (final value) + tangent` to the final tangent.

        Args:
            score: a weight of the objective's final value (REINFORCE's score), or None.
            tangent: a term added as it is (MVD's difference terms), or None.

        Returns:
            The continued site with the terms added.
        """
        ...

    def plus_replays(self, alternatives: Any, weights: Any, live: Any = True,
                     lane_axes: int | None = None) -> "Continued":
        """Add Σ_{j, lane} `weights[j, lane]` × (the rest's value with that lane of the
        site's value replaced by `alternatives[j, lane]`), over the `live` terms; the
        replay engine chooses how to run the replays (lane by lane, Markov-locally
        after a scan, or whole).

        Args:
            alternatives: `[J, *value.shape]` values the lanes take in turn.
            weights: `[J, *lanes]` weights, linear in the tangents.
            live: which terms count (a dead term adds 0 even where its replay is ±inf).
            lane_axes: how many leading axes of the value are lanes (default: all);
                with fewer, a lane is a slice replaced whole.

        Returns:
            The continued site with the replays' terms added (one set per rule).
        """
        ...


@runtime_checkable
class Continuation(Protocol):
    """The rest of the objective after a site: what `Strategy.jvp` receives as `k`.

    Example:
        >>> import genvi as gv, jax
        >>> class Score(gv.Strategy):
        ...     kind, needs = "SCORE", ("sample", "lane_log_prob", "scorable")
        ...     score_function = True
        ...     def jvp(self, dist, key, primals, tangents, k: gv.Continuation):
        ...         x = dist.sample(key, *primals)
        ...         _, s = gv.dual.jvp(lambda *p: dist.log_prob(x, *p), primals, tangents)
        ...         return k.dual(x).plus(score=s)
        >>> e = gv.expectation(lambda p: gv.sample(gv.flip(p, grad=Score())) + 1.0)
        >>> abs(float(e.grad_estimate(jax.random.key(0), 0.3))) > 0
        True
    """

    #: whether `dual_map` may be called: at the top level of an objective, not in a replay
    can_branch: bool

    def dual(self, value: Any, tangent: Any = None) -> Continued:
        """Continue with the site's `value` and its `tangent` (None: a symbolic zero).

        Args:
            value: the site's value, shaped as the site's draw.
            tangent: its tangent, for a rule that differentiates through the value.

        Returns:
            A `Continued` to add terms to with `plus` and `plus_replays`.
        """
        ...

    def pure(self, value: Any) -> Any:
        """The rest's value (primal only, an unbiased estimate with the same randomness
        elsewhere) with the site's value replaced by `value`: one replay of the
        objective. Wrap it in `jax.vmap` for several values; prefer
        `dual(...).plus_replays` when the result is a weighted sum of replays.

        Args:
            value: a value of the site's shape and dtype.

        Returns:
            The objective's value, a scalar.
        """
        ...

    def dual_map(self, values: Any) -> Any:
        """The whole dual rest at each of `values` (stacked on a leading axis), under
        one `vmap`: exact enumeration in one trace. Only where `can_branch`.

        Args:
            values: `[V, *value.shape]` values of the site.

        Returns:
            A `gv.dual.Dual` of `[V]` primals and tangents; a rule returning a `Dual`
            has evaluated the rest of the program itself.
        """
        ...

    def resolved(self, result: Continued) -> Continued:
        """`result` with its replays (if any) evaluated now and added to its terms.

        Args:
            result: what `dual(...)` and its `plus` calls built.

        Returns:
            The same site, with no replays pending.
        """
        ...

    def lanes_couple(self, value: Any, lane_axes: int | None = None) -> bool:
        """Whether replays of the site lane by lane would cost more than two evaluations
        of the rest, its lanes meeting in work done once per lane (a decoder reading a
        latent vector). False inside a scan or cond body. Traced abstractly: it leaves
        nothing in the estimator.

        Args:
            value: the site's value.
            lane_axes: lanes that are slices of the value (its leading axes).

        Returns:
            True where a strategy with a whole-site form should take it.
        """
        ...

    def replay_units(self, value: Any) -> int | None:
        """How many leading axes of the site's value a rule's lane-local replays should
        take as lanes: all where lane-by-lane replays are cheap; `batch_axes` where the
        rest couples each datapoint's lanes but not the datapoints; None where it
        couples them all.

        Args:
            value: the site's value.

        Returns:
            The `lane_axes` to give `plus_replays`, or None for a whole-site form.
        """
        ...

    @property
    def batch_axes(self) -> int:
        """How many leading axes of the site's value are lanes of the `vmap`
        transformations around it (a plate's datapoints, particles)."""
        ...

    @property
    def address(self) -> str:
        """The site's address as written ("outer/inner"; "(gv.sample)" for an unnamed
        draw), for a rule's error messages."""
        ...

    @property
    def location(self) -> tuple:
        """Where the site is in the run (its enclosing control flow and scan steps):
        what a replay's override names, and a key for a `RunState`'s records."""
        ...

    def state(self, strategy: Any) -> Any:
        """The run's `RunState` of `strategy` (an instance of its `run_state` class).

        Args:
            strategy: the strategy whose state is asked for (usually `self`).

        Returns:
            The state object, one per run of the objective.
        """
        ...

    def note(self, path: str) -> None:
        """Say how this site's gradient terms are evaluated (`gv.explain`'s replays
        column), e.g. "whole-site antithetic pair".

        Args:
            path: a short phrase.
        """
        ...
