"""AIR's sizes and priors in one place, shared by the genvi programs and the Pyro
side of the benchmark so that both run the same model.

Example:
    >>> from genvi_experiments.air.config import AIRConfig, pres_prior_probs
    >>> cfg = AIRConfig()
    >>> cfg.steps, cfg.window, cfg.z_what
    (3, 16, 50)
    >>> [round(p, 4) for p in pres_prior_probs(0.5, 3)]
    [0.4667, 0.4286, 0.3333]
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AIRConfig:
    """Network sizes (as in Pyro's AIR example) and the model's priors.

    * guide: an LSTM (`rnn_hidden`) reads the flattened canvas and the previous step's
      latents; a predict MLP (`predict_hidden`) gives z_pres's probability and
      z_where's location and scale; an encoder MLP (`encoder_hidden`) maps the
      attended window to z_what's location and scale.
    * model: a decoder MLP (`decoder_hidden`) maps z_what to a window,
      sigmoid(output + `decoder_bias`), placed by the spatial transformer.
    * baseline (REINFORCE with a learned baseline): its own LSTM and MLP
      (`baseline_hidden`), trained at `baseline_lr`.
    * `pres_prior` = k: P(count = n) ∝ kⁿ. Pyro's example defaults to 0.5; at 0.01
      each object costs 4.6 nats, which keeps the model from splitting one digit
      into two objects (with 0.5 the MVD run peaked at 94% then drifted to 90%).
    """

    canvas: int = 50
    window: int = 16
    steps: int = 3
    z_what: int = 50
    rnn_hidden: int = 256
    predict_hidden: int = 200
    encoder_hidden: int = 200
    decoder_hidden: int = 200
    baseline_hidden: int = 200
    likelihood_sd: float = 0.3
    where_prior_loc: tuple[float, float, float] = (3.0, 0.0, 0.0)
    where_prior_scale: tuple[float, float, float] = (0.2, 1.0, 1.0)
    pres_prior: float = 0.01
    decoder_bias: float = -2.0
    lr: float = 1e-4
    baseline_lr: float = 1e-3

    @property
    def pres_probs(self) -> list[float]:
        return pres_prior_probs(self.pres_prior, self.steps)


def pres_prior_probs(k: float, steps: int) -> list[float]:
    """Per-step success probabilities of z_pres giving a truncated geometric prior on
    the object count: P(count = n) ∝ kⁿ for n = 0 … steps, so each extra object costs
    the same log k. Step t's probability is P(count > t | count ≥ t)."""
    if not 0 < k <= 1:
        raise ValueError(f"the z_pres prior ratio k={k} must be in (0, 1]")
    tail = [sum(k ** m for m in range(n, steps + 1)) for n in range(steps + 2)]
    return [tail[t + 1] / tail[t] for t in range(steps)]
