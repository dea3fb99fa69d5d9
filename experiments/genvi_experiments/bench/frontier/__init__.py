"""The estimator frontier: one strategy per row at a model's discrete site (REINFORCE,
RLOO, SWOR, MVD, ENUM, SD, DisARM, RELAX, AUTO), measured by gradient variance, time
per estimate and their product at fixed parameters, and by the wall-clock time
training takes to a target objective or level (`gv.AUTO` included); on discrete-latent
VAEs (`discrete_vae`), a Gaussian mixture's assignments (`gmm`) and AIR's z_pres
(`air`), sharing `harness`; and the estimator lab (`gv.compare_estimators`, `lab`) on
three cases. Page: docs/benchmarks/frontier.md.
"""
