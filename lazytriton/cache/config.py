"""User settings, read from the environment at call time."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

log = logging.getLogger("lazytriton.cache")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """User settings, read from the environment by settings().

    - cache_dir: LAZYTRITON_CACHE_DIR, else $XDG_CACHE_HOME/lazytriton, else
      ~/.cache/lazytriton.
    - disk_cache: False when LAZYTRITON_CACHE=0 (memory only).
    - retune: LAZYTRITON_RETUNE=1 ignores stored tuning records, re-tunes and
      overwrites them.
    - tuning: False when LAZYTRITON_TUNING=off: no benchmarking, the first
      config left after pruning is used.  Heuristics (@triton.heuristics) and
      config pruning still apply; only the timing step is skipped.
    """

    cache_dir: Path
    disk_cache: bool = True
    retune: bool = False
    tuning: bool = True


def env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    log.warning("ignoring %s=%r (expected one of %s / %s)", name, raw, sorted(_TRUE), sorted(_FALSE))
    return default


def env_seconds(name: str, default: float) -> float:
    """A non-negative number of seconds from the environment (default if unset or bad)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        log.warning("ignoring %s=%r (expected a number of seconds >= 0)", name, raw)
        return default
    return value


def default_cache_dir() -> Path:
    explicit = os.environ.get("LAZYTRITON_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "lazytriton"


def settings() -> Settings:
    """Read the settings from the environment now (not cached)."""
    return Settings(
        cache_dir=default_cache_dir(),
        disk_cache=env_flag("LAZYTRITON_CACHE", True),
        retune=env_flag("LAZYTRITON_RETUNE", False),
        tuning=env_flag("LAZYTRITON_TUNING", True),
    )
