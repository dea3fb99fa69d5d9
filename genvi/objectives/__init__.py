"""The objective library. Every objective is an `Expectation` with the model's and
guide's (shared) arguments, and every one is maximized.

* `elbo`: ELBO, IWELBO, Rényi-α (HVI, IWHVI, DIWHVI are ELBO/IWELBO over a
  `gv.marginal` guide).
* `control_variates`: VIMCO and doubly-reparameterized IWELBO (DReG, STL at K=1).
* `wake_sleep`: reweighted wake-sleep phases and forward KL through SIR.
* `smc`: the log of a particle filter's evidence estimate (and FIVO, biased).
"""
