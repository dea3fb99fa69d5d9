"""Attend-Infer-Repeat (Eslami et al. 2016) in Pyro, the same model and guide as the
genvi AIR (`experiments/genvi_experiments/air`), so the two can be timed per training step.

Sizes and priors come from `AIRConfig`. The model draws, for t < T, z_pres_t ~
Bernoulli(pres_probs[t] · z_pres_{t-1}) and, masked by z_pres_t, z_where_t and z_what_t;
a decoder MLP draws each object in a window placed by a spatial transformer
(`F.affine_grid` + `F.grid_sample`, as `experiments/genvi_experiments/air/spatial.py`), and the canvas
is observed under Normal(·, likelihood_sd). The guide is an LSTM over the canvas and
the previous latents with a predict MLP (z_pres, z_where) and an encoder MLP on the
attended window (z_what). Three estimators: `TraceGraph_ELBO` without or with neural
baselines for z_pres, and `TraceEnum_ELBO` summing z_pres exactly (parallel
enumeration in the guide, 2^T branches). Losses are summed over the batch, as in
Pyro's AIR example. Needs `pip install -e ".[pyro]"`.

Example:
    >>> from genvi_experiments.air.config import AIRConfig
    >>> from genvi_experiments.air.data import make_canvases
    >>> data = make_canvases(train=64, test=8)
    >>> step = pyro_air_step(AIRConfig(), "tracegraph_baselines", seed=0)
    >>> loss = step(data.train[:32])  # one SVI step; the negative ELBO estimate
    >>> pyro_air_counts(step.air, data.test).shape
    (8,)

    python -m genvi_experiments.bench.air.in_pyro   # ms/step of each estimator at batch 64
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import numpy as np
import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.infer import SVI, TraceEnum_ELBO, TraceGraph_ELBO, config_enumerate
from torch import Tensor, nn

from genvi_experiments.air.config import AIRConfig

ESTIMATORS = ("tracegraph", "tracegraph_baselines", "traceenum")
_instances = itertools.count()  # unique pyro.module names, so instances never share params


def _mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for m, n in itertools.pairwise(sizes):
        layers += [nn.Linear(m, n), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _affine_sample(source: Tensor, scale: Tensor, x: Tensor, y: Tensor, size: int) -> Tensor:
    """Sample `source` [N, H, W] on a `size²` grid with θ = [[s,0,x],[0,s,y]] (bilinear,
    zero padding, align_corners=False); scale/x/y are [N]."""
    zero = torch.zeros_like(scale)
    theta = torch.stack([scale, zero, x, zero, scale, y], -1).view(-1, 2, 3)
    grid = F.affine_grid(theta, [source.shape[0], 1, size, size], align_corners=False)
    return F.grid_sample(source[:, None], grid, mode="bilinear", padding_mode="zeros",
                         align_corners=False)[:, 0]


def window_to_image(z_where: Tensor, window: Tensor, image_size: int) -> Tensor:
    """Place windows [..., W, W] on canvases [..., image_size, image_size]."""
    batch = torch.broadcast_shapes(z_where.shape[:-1], window.shape[:-2])
    w = z_where.expand(batch + (3,)).reshape(-1, 3)
    win = window.expand(batch + window.shape[-2:]).reshape((-1,) + window.shape[-2:])
    out = _affine_sample(win, w[:, 0], w[:, 1], w[:, 2], image_size)
    return out.view(batch + (image_size, image_size))


def image_to_window(z_where: Tensor, image: Tensor, window_size: int) -> Tensor:
    """Crop windows [..., window_size, window_size] out of images [..., H, W] with the
    inverse transform (1/s, -x/s, -y/s)."""
    batch = torch.broadcast_shapes(z_where.shape[:-1], image.shape[:-2])
    w = z_where.expand(batch + (3,)).reshape(-1, 3)
    img = image.expand(batch + image.shape[-2:]).reshape((-1,) + image.shape[-2:])
    s = w[:, 0]
    out = _affine_sample(img, 1.0 / s, -w[:, 1] / s, -w[:, 2] / s, window_size)
    return out.view(batch + (window_size, window_size))


def _lstm(cell: nn.LSTMCell, inputs: list[Tensor], h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """LSTMCell on the concatenated inputs, broadcasting leading (enumeration) dims."""
    batch = torch.broadcast_shapes(*(t.shape[:-1] for t in inputs), h.shape[:-1], c.shape[:-1])
    x = torch.cat([t.expand(batch + t.shape[-1:]) for t in inputs], -1)
    n = cell.hidden_size
    h, c = cell(x.reshape(-1, x.shape[-1]), (h.expand(batch + (n,)).reshape(-1, n),
                                             c.expand(batch + (n,)).reshape(-1, n)))
    return h.view(batch + (n,)), c.view(batch + (n,))


def _project(cell: nn.LSTMCell, image: Tensor) -> Tensor:
    """The image's share of the LSTM's input gates (computed once per image)."""
    return image @ cell.weight_ih[:, :image.shape[-1]].T


def _lstm_projected(cell: nn.LSTMCell, image_part: Tensor, latents: list[Tensor], h: Tensor,
                    c: Tensor) -> tuple[Tensor, Tensor]:
    """`LSTMCell` on cat(image, latents) given `_project(cell, image)`: torch's gate
    equations (order i, f, g, o), regrouped; broadcasts leading (enumeration) dims."""
    batch = torch.broadcast_shapes(*(t.shape[:-1] for t in latents), h.shape[:-1])
    z = torch.cat([t.expand(batch + t.shape[-1:]) for t in latents], -1)
    gates = (image_part + z @ cell.weight_ih[:, -z.shape[-1]:].T + cell.bias_ih
             + h @ cell.weight_hh.T + cell.bias_hh)
    i, f, g, o = gates.chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class PyroAIR(nn.Module):
    """AIR's networks with `model(data)` and `guide(data)` for Pyro's SVI; `data` is a
    float tensor [B, canvas, canvas]. `use_baselines` adds the neural baseline
    (its own LSTM and MLP) for each z_pres in the guide. `hoist` computes the image's
    share of the LSTM input once per image instead of once per step, as genvi's AIR
    does (the same cell, regrouped); without it the LSTMCell runs on the concatenated
    input, as in Pyro's AIR example."""

    def __init__(self, cfg: AIRConfig, use_baselines: bool = False, hoist: bool = True):
        super().__init__()
        self.cfg, self.use_baselines, self.hoist = cfg, use_baselines, hoist
        self.name = f"air{next(_instances)}"
        pixels, window = cfg.canvas ** 2, cfg.window ** 2
        rnn_in = pixels + 3 + cfg.z_what + 1
        self.decoder = _mlp(cfg.z_what, cfg.decoder_hidden, window)
        self.rnn = nn.LSTMCell(rnn_in, cfg.rnn_hidden)
        self.predict = _mlp(cfg.rnn_hidden, cfg.predict_hidden, 7)
        self.encoder = _mlp(window, cfg.encoder_hidden, 2 * cfg.z_what)
        if use_baselines:  # names start with "bl_": they train at cfg.baseline_lr
            self.bl_rnn = nn.LSTMCell(rnn_in, cfg.rnn_hidden)
            self.bl_predict = _mlp(cfg.rnn_hidden, cfg.baseline_hidden, 1)
        self.register_buffer("where_loc", torch.tensor(cfg.where_prior_loc, dtype=torch.float32))
        self.register_buffer("where_scale", torch.tensor(cfg.where_prior_scale, dtype=torch.float32))

    def model(self, data: Tensor) -> None:
        cfg = self.cfg
        pyro.module(self.name, self)
        b = data.shape[0]
        x = data.new_zeros(b, cfg.canvas, cfg.canvas)
        prev_pres = data.new_ones(b)
        with pyro.plate("data", b, dim=-1):
            for t in range(cfg.steps):
                pres = pyro.sample(f"z_pres_{t}", dist.Bernoulli(cfg.pres_probs[t] * prev_pres))
                with poutine.mask(mask=pres.bool()):  # absent objects: no log-density
                    where = pyro.sample(f"z_where_{t}", dist.Normal(
                        self.where_loc, self.where_scale).expand([b, 3]).to_event(1))
                    what = pyro.sample(f"z_what_{t}", dist.Normal(
                        data.new_zeros(b, cfg.z_what), 1.0).to_event(1))
                window = torch.sigmoid(self.decoder(what) + cfg.decoder_bias)
                window = window.view(window.shape[:-1] + (cfg.window, cfg.window))
                x = x + pres[..., None, None] * window_to_image(where, window, cfg.canvas)
                prev_pres = pres
            pyro.sample("obs", dist.Normal(x, cfg.likelihood_sd).to_event(2), obs=data)

    def guide(self, data: Tensor) -> list[Tensor]:
        """Returns the sampled z_pres of each step ([B] each, unless enumerated)."""
        cfg = self.cfg
        pyro.module(self.name, self)
        b = data.shape[0]
        image = data.reshape(b, -1)
        h = c = bl_h = bl_c = data.new_zeros(b, cfg.rnn_hidden)
        where, what, pres = data.new_zeros(b, 3), data.new_zeros(b, cfg.z_what), data.new_ones(b)
        out = []

        def lstm(cell, latents, h, c):
            if self.hoist:
                return _lstm_projected(cell, parts[cell], latents, h, c)
            return _lstm(cell, [image] + latents, h, c)

        cells = [self.rnn] + ([self.bl_rnn] if self.use_baselines else [])
        parts = {cell: _project(cell, image) for cell in cells} if self.hoist else {}
        with pyro.plate("data", b, dim=-1):
            for t in range(cfg.steps):
                prev = [where, what, pres[..., None]]
                h, c = lstm(self.rnn, prev, h, c)
                o = self.predict(h)
                p, where_loc, where_sd = torch.sigmoid(o[..., 0]), o[..., 1:4], F.softplus(o[..., 4:7])
                infer = {}
                if self.use_baselines:  # baseline net sees detached latents only
                    bl_h, bl_c = lstm(self.bl_rnn, [v.detach() for v in prev], bl_h, bl_c)
                    value = self.bl_predict(bl_h)[..., 0] * pres
                    infer = {"baseline": {"baseline_value": value}}
                pres = pyro.sample(f"z_pres_{t}", dist.Bernoulli(p * pres), infer=infer)
                with poutine.mask(mask=pres.bool()):
                    where = pyro.sample(f"z_where_{t}", dist.Normal(
                        where_loc + self.where_loc, where_sd * self.where_scale).to_event(1))
                    window = image_to_window(where, data, cfg.window)
                    e = self.encoder(window.reshape(window.shape[:-2] + (-1,)))
                    what = pyro.sample(f"z_what_{t}", dist.Normal(
                        e[..., :cfg.z_what], F.softplus(e[..., cfg.z_what:])).to_event(1))
                out.append(pres)
        return out


def pyro_air_step(cfg: AIRConfig, estimator: str, seed: int = 0, hoist: bool = True,
                  device: str = "cpu") -> Callable[[np.ndarray], float]:
    """A fresh `PyroAIR` (seeded, on torch's `device`) and `step(batch) -> loss`: one
    SVI step on a batch [B, canvas, canvas] (numpy or torch), returning the negative
    ELBO estimate summed over the batch. The AIR is at `step.air`, the SVI at
    `step.svi`. Estimators: "tracegraph", "tracegraph_baselines", "traceenum" (z_pres
    enumerated in the guide)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator {estimator!r} is not one of {ESTIMATORS}")
    pyro.set_rng_seed(seed)
    air = PyroAIR(cfg, use_baselines=estimator == "tracegraph_baselines",
                  hoist=hoist).to(device)
    guide = air.guide
    if estimator == "traceenum":
        guide = config_enumerate(air.guide, default="parallel")  # only z_pres is discrete
        elbo = TraceEnum_ELBO(max_plate_nesting=1)
    else:
        elbo = TraceGraph_ELBO()

    def lr(name: str) -> dict:  # name like "air0.bl_rnn.weight_ih"
        return {"lr": cfg.baseline_lr if name.split(".")[1].startswith("bl_") else cfg.lr}

    svi = SVI(air.model, guide, pyro.optim.Adam(lr), elbo)

    def step(batch: np.ndarray | Tensor) -> float:
        return svi.step(torch.as_tensor(batch, dtype=torch.float32, device=device))

    step.air, step.svi = air, svi  # type: ignore[attr-defined]
    return step


def pyro_air_counts(air: PyroAIR, data: np.ndarray | Tensor) -> np.ndarray:
    """The inferred object count of each canvas: the sum of the guide's sampled z_pres."""
    with torch.no_grad():
        pres = air.guide(torch.as_tensor(data, dtype=torch.float32, device=air.where_loc.device))
    return torch.stack(pres).sum(0).round().to(torch.int32).cpu().numpy()


if __name__ == "__main__":
    from genvi_experiments.air.data import make_canvases

    torch.set_num_threads(2)
    canvases = make_canvases(train=256, test=16)
    cfg, batch, steps = AIRConfig(), 64, 10
    print(f"# Pyro {pyro.__version__} AIR step, batch {batch}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    for estimator in ESTIMATORS:
        step = pyro_air_step(cfg, estimator)
        batches = [torch.from_numpy(canvases.train[i * batch % 256:][:batch]) for i in range(steps + 2)]
        for x in batches[:2]:  # warm-up
            step(x)
        times, losses = [], []
        for x in batches[2:]:
            start = time.perf_counter()
            losses.append(step(x))
            times.append((time.perf_counter() - start) * 1e3)
        counts = pyro_air_counts(step.air, canvases.test)
        print(f"{estimator:>22}: {np.mean(times):7.1f} ms/step mean, {np.median(times):7.1f} median  "
              f"(last loss {losses[-1]:.4g}, count accuracy "
              f"{np.mean(counts == canvases.test_counts):.2f})")
