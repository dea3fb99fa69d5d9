"""REPARAM: the pathwise gradient through a differentiable sampler."""

from __future__ import annotations

from typing import Any

import jax

from genvi.adev import dual as d
from genvi.core.strategy import Strategy, register_built_in


class Reparam(Strategy):
    """Pathwise gradient through a differentiable sampler."""

    kind = "REPARAM"
    needs = ("sample", "reparameterized")
    pathwise = True

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        x, dx = d.jvp(lambda *p: dist.sample(key, *p), primals, tangents)
        return k.dual(x, dx)


REPARAM = Reparam()
register_built_in(REPARAM, rank=0)  # the messages' order: pathwise first
