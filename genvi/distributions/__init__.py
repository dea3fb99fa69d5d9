"""Distributions: samplers and log densities, plus what each gradient strategy needs
(a reparameterized sampler, a finite support, measure-valued derivative terms)."""
