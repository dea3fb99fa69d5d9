"""REINFORCE: the score-function estimator, with a baseline if given, and
`decaying_average` for baselines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.core.strategy import Strategy, register_built_in


class Reinforce(Strategy):
    """Score-function estimator: f(x) ∂log p(x) + ∂f, optionally with a baseline.

    Example:
        >>> import genvi as gv
        >>> gv.REINFORCE.with_baseline(0.5).kind
        'REINFORCE'
    """

    kind = "REINFORCE"
    needs = ("sample", "lane_log_prob", "scorable")
    score_function = True

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        x = dist.sample(key, *primals)
        _, score = d.jvp(lambda *p: dist.log_prob(x, *p), primals, tangents)
        return k.dual(x).plus(score=score)

    def with_baseline(self, baseline: Any) -> "ReinforceBaseline":
        """REINFORCE with a control variate `baseline`: (f − b) ∂log p + ∂f.

        `baseline` is any value computed in the program: a constant, a decaying
        average you pass in (see `gv.decaying_average`), or a learned function of
        parameters. When it depends on differentiated parameters, those receive the
        gradient of −½ (f − b)², so a learned baseline trains with the objective.
        Its parameters must be its own: one that the objective also reads (a baseline
        network sharing the encoder's layers) is refused, since it would be trained on
        the sum; pass such a parameter behind `jax.lax.stop_gradient`.
        """
        return ReinforceBaseline(jnp.asarray(baseline))


@dataclass(frozen=True, eq=False)
class ReinforceBaseline(Strategy):
    """REINFORCE with a baseline (see `Reinforce.with_baseline`)."""

    baseline: Any = None
    baseline_tangent: Any = None
    kind = "REINFORCE"
    needs = Reinforce.needs
    score_function = True
    trains_operands = True  # a learned baseline descends −½ (f − b)²

    def split(self):
        return ReinforceBaseline(None), (self.baseline,)

    def join(self, operands, tangents=None):
        return ReinforceBaseline(operands[0], None if tangents is None else tangents[0])

    def __hash__(self):
        return hash(ReinforceBaseline)

    def __eq__(self, other):
        return isinstance(other, ReinforceBaseline)

    def __repr__(self) -> str:
        return "gv.REINFORCE.with_baseline(baseline)"

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        b = self.baseline
        x = dist.sample(key, *primals)
        if jnp.ndim(b) == 0:
            _, score = d.jvp(lambda *p: dist.log_prob(x, *p), primals, tangents)
            offset = d.mul(-b, score)
        else:  # one baseline per lane
            _, lane_score = d.jvp(lambda *p: dist.lane_log_prob(x, *p), primals, tangents)
            score = None if lane_score is None else jnp.sum(lane_score)
            offset = None if lane_score is None else -jnp.sum(b * lane_score)
        db = self.baseline_tangent
        if db is not None:  # learned baseline: ascend −½ (f − b)²
            score = d.add(score, jnp.sum(db))
            offset = d.add(offset, -jnp.sum(b * db))
        return k.dual(x).plus(score=score, tangent=offset)


REINFORCE = Reinforce()
register_built_in(REINFORCE, rank=2)  # after REPARAM and ENUM


def decaying_average(average: Any, value: Any, decay: float = 0.9) -> Any:
    """One step of an exponentially decaying average, for REINFORCE baselines.

    Args:
        average: the current average (a pytree).
        value: the new value (a pytree like `average`).
        decay: the weight kept by the old average, in [0, 1).

    Returns:
        `decay · average + (1 − decay) · value`, leaf by leaf.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.decaying_average(0.0, 1.0, decay=0.9)), 6)
        0.1
    """
    return decay * jnp.asarray(average) + (1 - decay) * jnp.asarray(value)
