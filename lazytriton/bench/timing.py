"""The one timing loop of the harness (and of benchmarks/launch_overhead.py)."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def interleaved(paths: dict[str, Callable[[int], float | None]], sync: Callable[[], None], *,
                rounds: int = 40, batch: int = 200) -> dict[str, list[float]]:
    """Host microseconds per call of each path, every sample kept. Rounds are
    interleaved so that drift in clocks or load hits every path alike. A path
    is fn(batch) -> seconds, or None to be timed here with the host clock;
    `batch` stays below the launch queue's depth so the GPU never throttles
    the host."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            sync()
            t0 = time.perf_counter()
            inner = fn(batch)
            dt = inner if inner is not None else time.perf_counter() - t0
            samples[name].append(dt / batch * 1e6)
    return samples


def summary(values: list[float]) -> dict:
    """Median and spread (10th to 90th percentile) of samples."""
    v = sorted(values)
    if not v:
        return {"median": float("nan"), "p10": float("nan"), "p90": float("nan"), "n": 0}
    pick = lambda q: v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]  # noqa: E731
    return {"median": statistics.median(v), "p10": pick(0.1), "p90": pick(0.9), "n": len(v)}
