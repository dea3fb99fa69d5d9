"""Discrete latents summed out in the model (`gv.enumeration()`) beside NumPyro's
`TraceEnum_ELBO` and its exact forms: the step time, the fitted means and the log
density against the exact one on a mixture, HMMs and batches of sequences
(`mixture_hmm`), nested plates (`plates`), every model in one table (`peers`); the
memory of a step (`memory`), and a chain's steps multiplied one after another or in
parallel (`chain_time`). Page: docs/benchmarks/enumeration.md.
"""
