"""Training: `gv.fit` (optax ascent in scanned chunks), checkpoints, progress and plots."""
