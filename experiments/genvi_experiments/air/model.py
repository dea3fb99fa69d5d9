"""AIR's networks and its model and guide as genvi programs.

The model draws up to `steps` objects with `gv.scan`: z_pres ~ flip(prior_t · previous
z_pres) (once an object is absent, all later ones are), and for a present object
z_where ~ N(where_prior), z_what ~ N(0, I); a decoder MLP turns z_what into a window
that the spatial transformer places on the canvas; pixels ~ N(canvas, σ). Sites of
absent objects are inside the untaken branch of a `jax.lax.cond`, so they are masked
(no density, no gradient terms), in the model and in the guide alike.

The guide reads the image with an LSTM (flax's `LSTMCell` parameters and equations;
the image's share of the input product is computed once, not once per step), fed
the previous step's latents; a predict MLP gives z_pres's probability and z_where's distribution; an
encoder MLP reads the window that z_where crops out of the image (the inverse warp)
and gives z_what's distribution. z_pres's gradient strategy is an argument: that is
the only thing the estimators change (see `genvi_experiments.air.estimators`).

Example:
    >>> import jax
    >>> from genvi_experiments.air.config import AIRConfig
    >>> from genvi_experiments.air.model import AIRNets, air_programs
    >>> import genvi as gv
    >>> cfg = AIRConfig(rnn_hidden=16, predict_hidden=8, encoder_hidden=8, decoder_hidden=8,
    ...                 z_what=4, window=6, canvas=12)
    >>> nets = AIRNets(cfg)
    >>> params = nets.init(jax.random.key(0))
    >>> model, guide = air_programs(cfg, nets, lambda t, params: gv.REINFORCE)
    >>> trace = model.simulate(jax.random.key(1), params, jax.numpy.zeros((12, 12)))
    >>> trace.choices["steps", "z_pres"].shape
    (3,)
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

import genvi as gv
from genvi_experiments.air.config import AIRConfig
from genvi_experiments.air.spatial import image_to_window, window_to_image
from genvi_experiments.common.nets import MLP, apply, init_params

#: `pres_grad(t, info) -> strategy`: z_pres's gradient strategy at step t (a traced
#: step index), given `info`: the parameters (`"params"`), the site's logit
#: (`"logit"`, clipped to ±`LOGIT_BOUND`: an absent object's presence has probability
#: 0) and with the baseline network its value (`"value"`), for learned baselines and
#: control variates.
PresGrad = Callable[[jax.Array, dict], gv.Strategy]
LOGIT_BOUND = 20.0

_GATES = ("i", "f", "g", "o")  # flax LSTMCell's gates: input, forget, cell, output


class AIRNets:
    """The flax networks of AIR and their parameters as one pytree:
    `{"guide": {"rnn", "predict", "encode"}, "decoder"}`, plus `"baseline": {"rnn",
    "predict"}` for the estimators with a learned baseline."""

    def __init__(self, cfg: AIRConfig):
        self.cfg = cfg
        self.rnn = nn.LSTMCell(cfg.rnn_hidden)
        self.predict = MLP((cfg.predict_hidden, 7))
        self.encoder = MLP((cfg.encoder_hidden, 2 * cfg.z_what))
        self.decoder = MLP((cfg.decoder_hidden, cfg.window ** 2))
        self.bl_predict = MLP((cfg.baseline_hidden, 1))
        self.rnn_input = cfg.canvas ** 2 + 3 + cfg.z_what + 1

    def init(self, key: jax.Array, baseline: bool = False) -> dict:
        """Initial parameters; the baseline network's only with `baseline` (the
        estimators without one carry no parameters they never use)."""
        cfg = self.cfg
        keys = jax.random.split(key, 6)
        params = {"guide": {"rnn": self._init_rnn(keys[0]),
                            "predict": init_params(self.predict, keys[1], cfg.rnn_hidden),
                            "encode": init_params(self.encoder, keys[2], cfg.window ** 2)},
                  "decoder": init_params(self.decoder, keys[3], cfg.z_what)}
        if baseline:
            params["baseline"] = {"rnn": self._init_rnn(keys[4]),
                                  "predict": init_params(self.bl_predict, keys[5], cfg.rnn_hidden)}
        return params

    def _init_rnn(self, key: jax.Array) -> dict:
        x = jnp.zeros(self.rnn_input)
        return self.rnn.init(key, self.zero_state(), x)["params"]

    def zero_state(self) -> tuple[jax.Array, jax.Array]:
        zeros = jnp.zeros(self.cfg.rnn_hidden)
        return zeros, zeros

    def step_rnn(self, params: dict, state: tuple, inputs: jax.Array) -> tuple:
        """One step of flax's `LSTMCell` on the full input (image and latents)."""
        state, _ = self.rnn.apply({"params": params}, state, inputs)
        return state

    def project_image(self, params: dict, flat_image: jax.Array) -> dict:
        """The LSTM cell specialised to one image, for `step_rnn_projected`: the
        image's share of the input product, x · W_x, for every step at once (the
        image is the same at every step, so this large product, 2,500 inputs of
        2,554, runs once per image instead of once per step), and the other kernels
        concatenated across gates, as flax's `OptimizedLSTMCell` does, so that a step
        is two matrix products instead of eight."""
        n = flat_image.shape[-1]
        return {"image": jnp.concatenate([flat_image @ params["i" + g]["kernel"][:n]
                                          for g in _GATES], -1),
                "latents": jnp.concatenate([params["i" + g]["kernel"][n:] for g in _GATES], -1),
                "h": jnp.concatenate([params["h" + g]["kernel"] for g in _GATES], -1),
                "bias": jnp.concatenate([params["h" + g]["bias"] for g in _GATES], -1)}

    def step_rnn_projected(self, projected: dict, state: tuple, latents: jax.Array) -> tuple:
        """`step_rnn` on (image, latents), given `project_image` of the image: the
        same LSTM cell (flax's parameters and gate equations), regrouped."""
        c, h = state
        pre = projected["image"] + latents @ projected["latents"] + h @ projected["h"] \
            + projected["bias"]
        i, f, g, o = jnp.split(pre, 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return c, jax.nn.sigmoid(o) * jnp.tanh(c)

    def decode(self, params: dict, z_what: jax.Array) -> jax.Array:
        w = self.cfg.window
        return jax.nn.sigmoid(apply(self.decoder, params, z_what) + self.cfg.decoder_bias).reshape(w, w)

    def encode(self, params: dict, window: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = apply(self.encoder, params, window.reshape(-1))
        return out[:self.cfg.z_what], jax.nn.softplus(out[self.cfg.z_what:])

    def predict_step(self, params: dict, h: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        out = apply(self.predict, params, h)
        return jax.nn.sigmoid(out[0]), out[1:4], jax.nn.softplus(out[4:7])

    def baseline(self, params: dict, state: tuple, projected: dict,
                 latents: jax.Array) -> tuple[jax.Array, tuple]:
        """The baseline value and the baseline LSTM's next state (`projected` is
        `project_image` of the baseline LSTM's parameters)."""
        state = self.step_rnn_projected(projected, state, latents)
        return apply(self.bl_predict, params["predict"], state[1])[0], state


def air_programs(cfg: AIRConfig, nets: AIRNets, pres_grad: PresGrad,
                 baseline: bool = False) -> tuple[gv.GenFn, gv.GenFn]:
    """`(model, guide)`, both taking `(params, image)` with image `[canvas, canvas]`.

    With `baseline`, the guide also runs the baseline network and hands its value to
    `pres_grad` as `info["value"]` (zero once an object is absent). The guide
    returns the per-step presence (for counting objects)."""
    where_loc = jnp.asarray(cfg.where_prior_loc)
    where_scale = jnp.asarray(cfg.where_prior_scale)
    prior_probs = jnp.asarray(cfg.pres_probs)
    no_where, no_what = jnp.zeros(3), jnp.zeros(cfg.z_what)

    @gv.gen
    def model(params: dict, image: jax.Array) -> jax.Array:
        @gv.gen
        def step(carry, prior_p):
            canvas, prev = carry
            pres = gv.flip(prior_p * prev) @ "z_pres"

            def present(canvas):
                where = gv.mv_normal_diag(where_loc, where_scale) @ "z_where"
                what = gv.mv_normal_diag(no_what, jnp.ones(cfg.z_what)) @ "z_what"
                window = nets.decode(params["decoder"], what)
                return canvas + window_to_image(where, window, cfg.canvas)

            canvas = jax.lax.cond(pres, present, lambda c: c, canvas)
            return (canvas, pres.astype(canvas.dtype)), None

        empty = jnp.zeros((cfg.canvas, cfg.canvas))
        (canvas, _), _ = gv.scan(step)((empty, jnp.ones(())), prior_probs) @ "steps"
        gv.observe(gv.normal(canvas, cfg.likelihood_sd), image)
        return canvas

    @gv.gen
    def guide(params: dict, image: jax.Array) -> jax.Array:
        g, flat = params["guide"], image.reshape(-1)
        image_part = nets.project_image(g["rnn"], flat)
        bl_image_part = nets.project_image(params["baseline"]["rnn"], flat) if baseline else None

        @gv.gen
        def step(carry, t):
            state, bl_state, where, what, prev = carry
            latents = jnp.concatenate([where, what, prev[None]])
            state = nets.step_rnn_projected(image_part, state, latents)
            p, loc, scale = nets.predict_step(g["predict"], state[1])
            logit = jnp.where(prev > 0, jnp.log(p) - jnp.log1p(-p), -LOGIT_BOUND)
            info = {"params": params, "logit": jnp.clip(logit, -LOGIT_BOUND, LOGIT_BOUND)}
            if baseline:  # it sees the latents but sends no gradient into them
                bl_value, bl_state = nets.baseline(params["baseline"], bl_state, bl_image_part,
                                                   jax.lax.stop_gradient(latents))
                info["value"] = bl_value * prev
            strategy = pres_grad(t, info)
            pres = gv.flip(p * prev, grad=strategy) @ "z_pres"

            def present(_):
                z_where = gv.mv_normal_diag(loc + where_loc, scale * where_scale,
                                            grad=gv.REPARAM) @ "z_where"
                what_loc, what_scale = nets.encode(g["encode"],
                                                   image_to_window(z_where, image, cfg.window))
                z_what = gv.mv_normal_diag(what_loc, what_scale, grad=gv.REPARAM) @ "z_what"
                return z_where, z_what

            where, what = jax.lax.cond(pres, present, lambda _: (no_where, no_what), None)
            pres = pres.astype(image.dtype)
            return (state, bl_state, where, what, pres), pres

        init = (nets.zero_state(), nets.zero_state(), no_where, no_what, jnp.ones(()))
        _, present = gv.scan(step)(init, jnp.arange(cfg.steps)) @ "steps"
        return present

    return model, guide
