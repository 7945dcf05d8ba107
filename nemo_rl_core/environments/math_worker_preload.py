"""Imported once by the math pool's forkserver: math-verify, sympy and their lazily loaded
parts are in memory before any worker forks, so a worker (or the replacement of a killed
one) starts warm in milliseconds."""

from nemo_rl_core.environments.math_verifier import warm_up

warm_up()
