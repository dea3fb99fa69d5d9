"""The discrete strategies' replays: a gradient step's time and `explain`'s counts
against REINFORCE's, lane-local in a plate (`plate`) and Markov-local in a scan
(`scan`), beside the whole-objective path; DisARM's and RELAX's forms in a plate of
latent vectors (`binary_plate_forms`); `gv.SD` on a plate of flips (`sd_plate`); and
the fit of `explain`'s CPU time model to these steps (`explain_calibration`). `steps`
holds what they share. Page: docs/benchmarks/replays.md.
"""
