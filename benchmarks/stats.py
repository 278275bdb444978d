"""Aggregate statistics of RL scores with confidence intervals, from rliable (Agarwal et al., 2021).

Scores are arrays of shape (runs, tasks): one row per seed, one column per dataset. Three aggregates
(rliable.metrics): the IQM (scipy.stats.trim_mean(scores, 0.25) over all runs and tasks; it cuts
int(n / 4) scores at each end, so with fewer than 4 scores it is the mean), the mean of the per-task means,
and the optimality gap (`gamma` minus the mean of min(score, gamma); gamma = 100, an expert's normalized
score). Their 95% confidence intervals are rliable.library.get_interval_estimates's, float for float (for
these three reproduced in one pass, below): a stratified bootstrap (seeds resampled within each task),
percentile method. Performance profiles (the fraction of
runs scoring above tau, with CIs) from rliable.library.create_performance_profile.

rliable's bootstrap calls its function once per replicate (2000 by default, per table row), in Python. The
aggregates' intervals, the bulk of a table, are computed here in one pass over all replicates instead
(`_batched_aggregates_bootstrap`: the same draws from the same RNG, the same per-replicate floats and arch's
percentile bounds), and where the per-replicate loop remains (performance profiles, scores with nan) two of
rliable's functions are given in a form that returns the same floats with less Python around them: the IQM
calls scipy's trim_mean under its argument wrapper (which took 85% of each call), and the performance
profile's score distribution compares the scores with every tau at once instead of rliable's np.vectorize
over taus. Tests compare all three with rliable's bit for bit, and the committed tables regenerate byte for
byte: the grid's statistics took 35 s of rliable's loop and now take well under a second.

rliable draws its bootstrap indices from numpy's global RNG and ignores its `random_state`, so each call
here seeds that RNG with `seed` (and restores the caller's RNG state afterwards): a given score array gets
the same CI whatever else is computed, and a table regenerates byte-for-byte. rliable is the optional extra
`pip install -e ".[stats]"`; without it (or where it does not import) the same numbers come from a copy of
its bootstrap below, which draws the same indices in the same order (tests compare the two).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import numpy as np

REPS = 2000
SEED = 0
CONFIDENCE = 0.95
GAMMA = 100.0  # optimality gap threshold: the expert's normalized score
METRICS = ("iqm", "mean", "optimality_gap")
FALLBACK = "offrl's copy of rliable's bootstrap (rliable not importable)"


def _rliable():
    """(library, metrics, version) of rliable, or None where it is missing or fails to import (rliable 1.2
    imports arch, whose releases before 8 break on pandas 3 and whose release 8 breaks rliable's bootstrap)."""
    global IMPORT_ERROR
    try:
        import rliable
        from rliable import library, metrics
    except Exception as e:  # noqa: BLE001 - ImportError, or arch/pandas API breaks raising TypeError at import
        IMPORT_ERROR = f"{type(e).__name__}: {e}"
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return library, metrics, version("rliable")
    except PackageNotFoundError:
        return library, metrics, getattr(rliable, "__version__", "?")


IMPORT_ERROR: str | None = None  # why rliable did not import, where it did not
_UNLOADED = object()
_RLIABLE = _UNLOADED  # (library, metrics, version) or None; imported on first use (pandas, arch, seaborn: seconds)


def _lib():
    global _RLIABLE
    if _RLIABLE is _UNLOADED:
        _RLIABLE = _rliable()
    return _RLIABLE


def implementation() -> str:
    """Who computes the intervals, for captions: 'rliable 1.2.0' or the fallback."""
    if _lib() is not None:
        return f"rliable {_RLIABLE[2]}"
    return FALLBACK


def trim_mean(scores: np.ndarray) -> float:
    try:
        from scipy.stats import trim_mean as scipy_trim_mean
    except ImportError:
        x = np.sort(np.asarray(scores, dtype=np.float64).ravel())
        cut = int(0.25 * len(x))
        return float(x[cut:len(x) - cut].mean())
    return float(scipy_trim_mean(scores, proportiontocut=0.25, axis=None))


def _unwrapped_trim_mean():
    """scipy.stats.trim_mean without scipy's nan-policy/axis wrapper, or None. rliable's aggregate_iqm is
    scipy.stats.trim_mean(scores, 0.25, axis=None); the wrapper around it costs ~0.2 ms a call (inspect.signature
    and argument checks), 85% of the call, and a bootstrap calls it once per replicate. On finite scores it
    returns the same float (the same partition and mean of the same raveled array: tests compare the two)."""
    try:
        from scipy.stats import trim_mean as scipy_trim_mean
    except ImportError:
        return None
    return getattr(scipy_trim_mean, "__wrapped__", None)


_UNWRAPPED_TRIM_MEAN = _UNLOADED


def aggregate_iqm(scores: np.ndarray) -> float:
    global _UNWRAPPED_TRIM_MEAN
    if _lib() is not None:
        if _UNWRAPPED_TRIM_MEAN is _UNLOADED:
            _UNWRAPPED_TRIM_MEAN = _unwrapped_trim_mean()
        if _UNWRAPPED_TRIM_MEAN is not None and np.isfinite(scores).all():  # nan: the wrapper's nan policy decides
            return float(_UNWRAPPED_TRIM_MEAN(scores, 0.25, axis=None))
        return float(_RLIABLE[1].aggregate_iqm(scores))
    return trim_mean(scores)


def aggregate_mean(scores: np.ndarray) -> float:
    if _lib() is not None:
        return float(_RLIABLE[1].aggregate_mean(scores))
    return float(np.mean(np.mean(scores, axis=0), axis=0))


def aggregate_optimality_gap(scores: np.ndarray, gamma: float = GAMMA) -> float:
    if _lib() is not None:
        return float(_RLIABLE[1].aggregate_optimality_gap(scores, gamma))
    return float(gamma - np.mean(np.minimum(scores, gamma)))


def aggregates(scores: np.ndarray) -> np.ndarray:
    """[IQM, mean, optimality gap] of a (runs, tasks) score array."""
    return np.array([aggregate_iqm(scores), aggregate_mean(scores), aggregate_optimality_gap(scores)])


@contextmanager
def _seeded(seed: int):
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _bootstrap(scores: np.ndarray, func: Callable[[np.ndarray], np.ndarray], reps: int,
               confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """rliable's StratifiedBootstrap.conf_int(method='percentile') without rliable and arch: per replicate,
    runs drawn with replacement within each task from numpy's global RNG, the same draws in the same order."""
    runs, tasks = scores.shape
    columns = np.arange(tasks)[None, :]
    base = np.atleast_1d(func(scores))
    results = np.zeros((reps, base.shape[0]))
    for i in range(reps):
        results[i] = func(scores[np.random.choice(runs, scores.shape, replace=True), columns])
    alpha = (1.0 - confidence) / 2
    percentiles = [100 * alpha, 100 * (1.0 - alpha)]
    bounds = np.array([np.percentile(results[:, k], percentiles) for k in range(base.shape[0])]).T
    return base, bounds


def _aggregates_of_replicates(samples: np.ndarray) -> np.ndarray:
    """`aggregates` of every replicate of a (reps, runs, tasks) array at once, as (reps, 3): each row the floats
    `aggregates` gives that replicate (the same partition per row for the IQM, and reductions over each
    replicate's own contiguous values in the same order; tests compare them with rliable's bit for bit)."""
    reps, runs, tasks = samples.shape
    flat = samples.reshape(reps, runs * tasks)
    n = runs * tasks
    low = int(0.25 * n)  # scipy.stats.trim_mean(scores, 0.25, axis=None): the raveled scores, partitioned
    iqm = np.mean(np.partition(flat, (low, n - low - 1), axis=1)[:, low:n - low], axis=1)
    mean = np.mean(np.mean(samples, axis=1), axis=1)  # rliable.metrics.aggregate_mean: per task, then over tasks
    gap = GAMMA - np.mean(np.minimum(flat, GAMMA), axis=1)  # rliable.metrics.aggregate_optimality_gap
    return np.stack([iqm, mean, gap], axis=1)


def _batched_aggregates_bootstrap(scores: np.ndarray, reps: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """rliable's get_interval_estimates(scores, aggregates, method='percentile') in one pass: the replicates'
    run indices drawn from numpy's global RNG in one call (the legacy RandomState draws them value by value, so
    in the order rliable's StratifiedBootstrap draws them a replicate at a time), the aggregates of all
    replicates at once, and arch's percentile bounds per aggregate. The per-replicate loop took ~0.25 ms a
    replicate in Python (2000 per table row); this takes a few ms a row."""
    runs, tasks = scores.shape
    samples = scores[np.random.choice(runs, (reps, runs, tasks), replace=True), np.arange(tasks)]
    results = _aggregates_of_replicates(samples)
    alpha = (1.0 - confidence) / 2  # arch.bootstrap's conf_int, two-tailed percentile method
    percentiles = [100 * alpha, 100 * (1.0 - alpha)]
    bounds = np.array([np.percentile(results[:, k], percentiles) for k in range(results.shape[1])]).T
    return aggregates(scores), bounds


def interval_estimates(scores: np.ndarray, func: Callable[[np.ndarray], np.ndarray] = aggregates,
                       reps: int = REPS, seed: int = SEED, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """(point estimates, [lower; upper] CIs) of `func` on a (runs, tasks) score array, by rliable's
    get_interval_estimates under a fixed seed."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(f"scores must be a non-empty (runs, tasks) array, got shape {scores.shape}")
    with _seeded(seed):
        if func is aggregates and np.isfinite(scores).all():  # nan/inf: the per-replicate functions' own handling
            return _batched_aggregates_bootstrap(scores, reps, confidence)
        if _lib() is None:
            return _bootstrap(scores, func, reps, confidence)
        points, intervals = _RLIABLE[0].get_interval_estimates(
            {"x": scores}, func, method="percentile", reps=reps, confidence_interval_size=confidence)
    return np.atleast_1d(np.asarray(points["x"], dtype=np.float64)), np.asarray(intervals["x"], dtype=np.float64)


def summary(scores: np.ndarray, reps: int = REPS, seed: int = SEED, confidence: float = CONFIDENCE,
            optimality_gap: bool = True) -> dict[str, dict]:
    """{'iqm' | 'mean' | 'optimality_gap': {'point', 'ci': [low, high]}} of a (runs, tasks) array."""
    points, intervals = interval_estimates(scores, aggregates, reps, seed, confidence)
    out = {name: {"point": float(points[i]), "ci": [float(intervals[0, i]), float(intervals[1, i])]}
           for i, name in enumerate(METRICS)}
    if not optimality_gap:
        del out["optimality_gap"]
    return out


def tau_grid(score_arrays: list[np.ndarray], points: int = 101) -> np.ndarray:
    """Thresholds for performance profiles: from min(0, floor(lowest score)) to max(100, ceil(highest score))."""
    values = np.concatenate([np.ravel(s) for s in score_arrays]) if score_arrays else np.zeros(1)
    return np.linspace(min(0.0, float(np.floor(values.min()))), max(GAMMA, float(np.ceil(values.max()))), points)


def _score_distribution(scores: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """Fraction of a (runs, tasks) array's scores above each tau: rliable.library.score_distributions."""
    return (scores[..., None] > taus).mean(axis=(0, 1))


def performance_profile(scores: np.ndarray, taus: np.ndarray, reps: int = REPS, seed: int = SEED,
                        confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """(fraction of runs scoring above each tau, [lower; upper] CIs): rliable's score distribution
    (create_performance_profile) of one (runs, tasks) array under a fixed seed."""
    scores = np.asarray(scores, dtype=np.float64)
    taus = np.asarray(taus, dtype=np.float64)
    with _seeded(seed):
        if _lib() is None:
            return _bootstrap(scores, lambda s: _score_distribution(s, taus), reps, confidence)
        # rliable's score distribution (score_distributions: np.mean(scores > tau) per tau, an np.vectorize
        # of Python calls) as one array comparison: the same counts over the same n, so the same floats, ~200x
        # faster a replicate. rliable's bootstrap draws the replicates as it does for its own function.
        profiles, cis = _RLIABLE[0].create_performance_profile(
            {"x": scores}, taus, custom_profile_func=_score_distribution, method="percentile", reps=reps,
            confidence_interval_size=confidence)
    return np.asarray(profiles["x"], dtype=np.float64), np.asarray(cis["x"], dtype=np.float64)


def mean_band(values_per_step: list[np.ndarray], reps: int = REPS, seed: int = SEED,
              confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Learning-curve band: per step the mean over seeds and a percentile-bootstrap CI of it (seeds
    resampled; vectorized, a numpy Generator seeded with `seed`). A step with one seed gets no band (nan)."""
    rng = np.random.default_rng(seed)
    alpha = 100 * (1.0 - confidence) / 2
    means, lows, highs = [], [], []
    for values in values_per_step:
        values = np.asarray(values, dtype=np.float64)
        means.append(values.mean())
        if len(values) < 2:
            lows.append(np.nan)
            highs.append(np.nan)
            continue
        draws = values[rng.integers(0, len(values), size=(reps, len(values)))].mean(axis=1)
        low, high = np.percentile(draws, [alpha, 100 - alpha])
        lows.append(low)
        highs.append(high)
    return np.array(means), np.array(lows), np.array(highs)
