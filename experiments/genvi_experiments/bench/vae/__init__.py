"""The VAE: one training step beside hand-written JAX, NumPyro and Pyro (`step`), that
step's matrix-product floor (`roofline`), the semi-supervised M2 step with its label
enumerated beside Pyro's `TraceEnum_ELBO` (`ssvae_step`), and the test ELBO genvi and
NumPyro reach on the same objective (`quality`). The four systems' steps are in
`genvi_experiments.bench.systems`. Page: docs/benchmarks/vae.md.
"""
