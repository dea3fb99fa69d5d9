"""genvi's benchmarks, grouped by family, each module run as
`python -m genvi_experiments.bench.<family>.<name>` (BENCHMARKS.md is the index, with a
page per family in docs/benchmarks/):

* `frontier`: the estimator frontier, every strategy at one discrete site;
* `enumeration`: discrete latents summed out in the model, beside NumPyro;
* `vae`: the VAE training step and quality beside hand-written JAX, NumPyro and Pyro;
* `air`: Attend-Infer-Repeat's training step beside Pyro, and its compile;
* `replays`: the discrete strategies' replays in a plate and in a scan;
* `peers`: NumPyro's and Pyro's own models fitted by both libraries;
* `changes`: genvi against its earlier commits.

The tooling stays here: `results` (recorded tables and their pages), `against` (a
benchmark at a base commit beside the working tree), `systems` (the VAE step in four
systems, shared by the VAE and AIR benchmarks) and `gpu_tables.sh`.
"""
