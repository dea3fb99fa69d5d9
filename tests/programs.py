"""Small programs several test modules share.

The conjugate Gaussian pair: `z ~ normal(0, 1)`, `y ~ normal(z, 1)`, with a guide
`normal(p["m"], exp(p["s"]))`. Its optimum is known: m = y / 2, s = log(sqrt(1/2)).
"""

import jax.numpy as jnp

import genvi as gv


@gv.gen
def model(p, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


@gv.gen
def guide(p, y):
    gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"
