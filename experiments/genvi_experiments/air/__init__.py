"""Attend-Infer-Repeat (Eslami et al. 2016) in genvi: data, spatial transformer,
networks, model and guide, estimators, training and figures (`genvi run air`)."""
