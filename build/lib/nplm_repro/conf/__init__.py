"""Hydra's configs, installed as the package `nplm_repro.conf` (pyproject.toml's package-dir), so every command
composes them as `pkg://nplm_repro.conf` from any directory, from a checkout (`pip install -e .`) or a wheel.

`study/` is a link to the top-level `sweeps/`: the studies are the config group `study` (`-m study=<name>`).
"""
