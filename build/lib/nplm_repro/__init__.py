"""nplm-repro: Bengio et al. (2003), "A Neural Probabilistic Language Model", reproduced."""
