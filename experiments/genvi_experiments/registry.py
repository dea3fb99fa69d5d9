"""The experiments `genvi run NAME` runs, as small records: the module that runs one
(its `main(argv)`), what it does in a line, and its wall time at the defaults on 2
CPU cores (measured 2026-11-23 with `genvi run NAME`, compile included).

pyproject.toml names each record in the `genvi.experiments` entry-point group
(`noisy_cone = "genvi_experiments.registry:NOISY_CONE"`), and `genvi list` reads them
all, so this module imports nothing heavy (no JAX): an experiment's module is
imported only when it runs.

Example:
    >>> from genvi_experiments.registry import NOISY_CONE
    >>> NOISY_CONE.module, NOISY_CONE.time
    ('genvi_experiments.noisy_cone', '20 s')
"""

from __future__ import annotations

from typing import NamedTuple


class Experiment(NamedTuple):
    """One experiment for `genvi run`: `module` has `main(argv)` (argv: the options
    after the name, `--out` included); `about` and `time` are `genvi list`'s columns."""

    module: str
    about: str
    time: str


NOISY_CONE = Experiment(
    "genvi_experiments.noisy_cone",
    "the paper's noisy cone: ELBO, IWELBO, HVI, IWHVI, DIWHVI (Table 4)", "20 s")
VAE = Experiment(
    "genvi_experiments.vae",
    "VAE on digits (ELBO or IWELBO training; test ELBO and log-likelihood)", "2.5 min")
SSVAE = Experiment(
    "genvi_experiments.ssvae",
    "semi-supervised VAE (M2), enumerated labels, 10% labelled", "35 s")
CVAE = Experiment(
    "genvi_experiments.cvae",
    "conditional VAE completing digits from one quadrant, with a baseline", "45 s")
EIGHT_SCHOOLS = Experiment(
    "genvi_experiments.eight_schools",
    "eight schools with automatic guides (auto_normal; auto_mvn on the ELBO, Rényi, IWELBO, "
    "inclusive KL, and its exact ELBO optimum) beside NUTS", "55 s")
LOGREG = Experiment(
    "genvi_experiments.logreg",
    "Bayesian logistic regression on 100,000 points: gv.plate, gv.auto_normal, gv.predictive",
    "10 s")
GMM = Experiment(
    "genvi_experiments.gmm",
    "a Gaussian mixture on 100,000 points: global means, gv.plate minibatches, assignments "
    "enumerated in the plate", "5 s")
AIR = Experiment(
    "genvi_experiments.air.run",
    "Attend-Infer-Repeat on multi-digit canvases: REINFORCE, MVD, IWELBO+MVD (--quick: one "
    "estimator, under a minute; --all: the paper's eight, 2 h 50 min)", "8 min")
