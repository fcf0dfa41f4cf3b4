"""Polar Express coefficients (Amsel, Persson, Musco, Gower 2025, "The Polar Express:
Optimal Matrix Sign Methods and Their Application to the Muon Algorithm"): one odd
quintic p(x) = a x + b x^3 + c x^5 per Newton-Schulz iteration instead of Muon's one
repeated quintic, each the best for the singular values the previous ones leave.

Computed as the authors' ``polar_express.py`` (NoahAmsel/PolarExpress) does, with its
settings: singular values assumed in [1e-3, 1] after normalisation, 10 iterations, a
1 % safety factor on all but the last, and a cushion of 0.02 (the interval's lower
end is kept at least 0.02 of the upper while fitting, then the quintic is rescaled
to centre [l, u] on 1). The iteration divides the input by 1.01 times its norm.

A few 4 x 4 solves (numpy's, as the reference) per quintic.
"""

from __future__ import annotations

import math

import numpy as np

LOWER, ITERATIONS, SAFETY, CUSHION = 1e-3, 10, 1e-2, 0.02
# The input is divided by this times its Frobenius norm, so that the safety factor
# covers the norm's rounding in low precision.
NORM_MARGIN = 1.01


def best_quintic(lo: float, hi: float) -> tuple[float, float, float]:
    """The odd quintic closest to 1 in the max norm on [lo, hi]: it equioscillates at
    lo, its two critical points q < r, and hi (Remez exchange on those four points).
    Near lo = hi the exchange is ill-conditioned, so it computes with numpy's types
    exactly as the reference does (a last-bit difference there moves the later
    coefficients by ~1e-6)."""
    if lo / hi >= 1 - 5e-6:  # numerically the limit as lo -> hi
        return (15 / 8) / hi, (-10 / 8) / hi ** 3, (3 / 8) / hi ** 5
    q, r = (3 * lo + 1) / 4, (lo + 3) / 4
    error, previous = math.inf, None
    while not previous or abs(previous - error) > 1e-15:
        previous = error
        system = np.array([[x, x ** 3, x ** 5, s]
                           for x, s in zip((lo, q, r, hi), (1, -1, 1, -1))])
        a, b, c, error = np.linalg.solve(system, np.ones(4))
        q, r = np.sqrt((-3 * b + np.array([-1, 1]) * math.sqrt(9 * b ** 2 - 20 * a * c))
                       / (10 * c))
    return float(a), float(b), float(c)


def coefficients(iterations: int = ITERATIONS, lower: float = LOWER, safety: float = SAFETY,
                 cushion: float = CUSHION) -> list[tuple[float, float, float]]:
    """The composition: each quintic fitted to where the previous ones left the
    singular values, [l, 2 - l]."""
    lo, hi, out = lower, 1.0, []
    for i in range(iterations):
        a, b, c = best_quintic(max(lo, cushion * hi), hi)
        if cushion * hi > lo:  # fitted on a narrower interval: centre [lo, hi] on 1
            p_lo, p_hi = (a * lo + b * lo ** 3 + c * lo ** 5, a * hi + b * hi ** 3 + c * hi ** 5)
            scale = 2 / (p_lo + p_hi)
            a, b, c = a * scale, b * scale, c * scale
        if i < iterations - 1:
            f = 1 + safety
            a, b, c = a / f, b / f ** 3, c / f ** 5
        out.append((a, b, c))
        lo = a * lo + b * lo ** 3 + c * lo ** 5
        hi = 2 - lo
    return out


def schedule(steps: int) -> list[tuple[float, float, float]]:
    """The quintics of ``steps`` iterations: the first ones, the last repeated.
    Computed at each call (about half a millisecond, beside a step's matrix products),
    not once at import, so that nothing computed before a test can hide a change."""
    quintics = coefficients()
    return quintics[:steps] + [quintics[-1]] * max(0, steps - len(quintics))
