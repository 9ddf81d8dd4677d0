"""User settings: every LAZYTRITON_* environment variable is read and checked
here, at call time (not cached).  A bad value is a SettingError naming the
variable, its value and what it takes; an unset or empty one is the default."""

from __future__ import annotations

import dataclasses
import re
import os
from pathlib import Path
from typing import Optional

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_FLAG = "1/0 (also true/false, yes/no, on/off)"


class SettingError(ValueError):
    """A LAZYTRITON_* environment variable holds a value it does not take."""

    def __init__(self, name: str, raw: str, accepts: str) -> None:
        super().__init__(f"{name}={raw!r} is not a valid setting: it takes {accepts} (or unset for the default)")
        self.name = name


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


def _raw(name: str) -> Optional[str]:
    raw = os.environ.get(name)
    return None if raw is None or raw.strip() == "" else raw


def env_flag(name: str, default: bool) -> bool:
    raw = _raw(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(name, raw, _FLAG)


def env_seconds(name: str, default: float) -> float:
    """A non-negative number of seconds."""
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise SettingError(name, raw, "a number of seconds >= 0")
    return value


def env_int(name: str, default: Optional[int], minimum: int = 0) -> Optional[int]:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise SettingError(name, raw, f"an integer >= {minimum}")
    return value


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    raw = _raw(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise SettingError(name, raw, " or ".join(repr(c) for c in choices))
    return value


def default_cache_dir() -> Path:
    explicit = _raw("LAZYTRITON_CACHE_DIR")
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


# -- the settings other modules read (each in one place) ---------------------------

def compile_workers() -> Optional[int]:
    """LAZYTRITON_COMPILE_WORKERS: compile processes (0: threads in this process); None: the default."""
    return env_int("LAZYTRITON_COMPILE_WORKERS", None)


def compile_ahead() -> bool:
    """LAZYTRITON_COMPILE_AHEAD=0: a JAX program's call sites are not compiled in the background
    when it is lowered (default 1: they are, on a GPU machine, so that its first step only tunes)."""
    return env_flag("LAZYTRITON_COMPILE_AHEAD", True)


def stub_build() -> str:
    """LAZYTRITON_STUB_BUILD: "background" (default: the table-driven stub serves a shape's first
    calls while its generated stub builds), "sync" (build before the first call) or "off" (never
    build: the table-driven stub serves every call, no C++ compiler needed)."""
    return env_choice("LAZYTRITON_STUB_BUILD", ("sync", "background", "off"), "background")


def stub_build_sync() -> bool:
    """LAZYTRITON_STUB_BUILD=sync: build a shape's launch stub before its first call."""
    return stub_build() == "sync"


def flush_l2() -> Optional[bool]:
    """LAZYTRITON_FLUSH_L2=0/1 forces flushing L2 between tuning trials; None (auto): when the buffers fit in L2."""
    if env_choice("LAZYTRITON_FLUSH_L2", ("auto", *_TRUE, *_FALSE), "auto") == "auto":
        return None
    return env_flag("LAZYTRITON_FLUSH_L2", False)


def prebuilt_handler() -> bool:
    """LAZYTRITON_PREBUILT_HANDLER=0: build the XLA FFI handler against the jaxlib in use."""
    return env_flag("LAZYTRITON_PREBUILT_HANDLER", True)


def capture_fallback() -> str:
    """LAZYTRITON_CAPTURE_FALLBACK: what a JAX call site first executed under capture does."""
    return env_choice("LAZYTRITON_CAPTURE_FALLBACK", ("record", "first_config"), "record")


# The compute capabilities of NVIDIA GPUs (Maxwell to Blackwell), which Triton's NVIDIA backend
# compiles for through its ptxas; a number that is none of them (7 for sm_70) fails every compile.
NVIDIA_CAPABILITIES = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)
# AMD architectures Triton's AMD backend compiles for: CDNA (gfx9xx) and RDNA (gfx10xx-gfx12xx), as
# LLVM names them, with HIP's feature suffix (gfx942:sramecc+:xnack-) allowed.
_AMD_ARCH = r"gfx(9[0-9][0-9a-f]|1[0-2][0-9][0-9a-f])(:[a-z0-9+:-]*)?"


def default_arch(fallback: int | str) -> str:
    """LAZYTRITON_DEFAULT_ARCH: the target compiled for where no GPU is present: an NVIDIA compute
    capability (90, sm_90) or an AMD architecture (gfx942), as lazytriton.compile.target_for reads it."""
    raw = _raw("LAZYTRITON_DEFAULT_ARCH")
    if raw is None:
        return str(fallback)
    value = raw.strip().lower()
    digits = value.removeprefix("sm_").removeprefix("sm")
    if not (digits.isdigit() and int(digits) in NVIDIA_CAPABILITIES) and not re.fullmatch(_AMD_ARCH, value):
        raise SettingError("LAZYTRITON_DEFAULT_ARCH", raw, "an NVIDIA compute capability, as 90 or sm_90 ("
                           f"{', '.join(map(str, NVIDIA_CAPABILITIES))}), or an AMD architecture (gfx90a, "
                           "gfx942, gfx950, gfx1100, gfx1201, ...)")
    return value


# -- the remote cache tier (lazytriton.cache.remote): every setting it reads, in one block ----------

REMOTE_CACHE_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_REMOTE_TIMEOUT_S = 0.5
DEFAULT_REMOTE_RETRY_AFTER_S = 30.0
DEFAULT_REMOTE_TTL_S = 30 * 24 * 3600.0
DEFAULT_REMOTE_MAX_ENTRY_BYTES = 8 << 20


def remote_cache_url() -> Optional[str]:
    """LAZYTRITON_REMOTE_CACHE: the fleet's cache server behind the local cache, as a Redis URL
    (redis://[[user]:password@]host:port/db, rediss:// for TLS, unix:///path?db=N); None: no remote tier."""
    raw = _raw("LAZYTRITON_REMOTE_CACHE")
    if raw is None:
        return None
    value = raw.strip()
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in REMOTE_CACHE_SCHEMES or not rest:
        raise SettingError("LAZYTRITON_REMOTE_CACHE", raw, "a Redis URL: redis://host:port/db, rediss://host:port/db "
                           "(TLS; a password as redis://:PASSWORD@host:port/db) or unix:///path/redis.sock?db=0")
    return value


def remote_cache_timeout() -> float:
    """LAZYTRITON_REMOTE_CACHE_TIMEOUT: seconds one request to the remote cache may take, connecting
    included (default 0.5); a request that takes longer is a miss (or an unpublished entry), never an error."""
    value = env_seconds("LAZYTRITON_REMOTE_CACHE_TIMEOUT", DEFAULT_REMOTE_TIMEOUT_S)
    if value == 0:
        raise SettingError("LAZYTRITON_REMOTE_CACHE_TIMEOUT", os.environ["LAZYTRITON_REMOTE_CACHE_TIMEOUT"],
                           "a number of seconds > 0")
    return value


def remote_cache_retry_after() -> float:
    """LAZYTRITON_REMOTE_CACHE_RETRY_AFTER: seconds a process leaves the remote cache alone after it
    failed (unreachable, slow, refusing writes) before trying it again (default 30)."""
    return env_seconds("LAZYTRITON_REMOTE_CACHE_RETRY_AFTER", DEFAULT_REMOTE_RETRY_AFTER_S)


def remote_cache_ttl() -> float:
    """LAZYTRITON_REMOTE_CACHE_TTL: seconds a remote entry lives unused (default 30 days); every hit
    renews it. 0: entries never expire (then size the server's maxmemory-policy to evict)."""
    return env_seconds("LAZYTRITON_REMOTE_CACHE_TTL", DEFAULT_REMOTE_TTL_S)


def remote_cache_max_entry() -> int:
    """LAZYTRITON_REMOTE_CACHE_MAX_ENTRY: the largest value, in bytes, published to the remote cache
    (default 8 MiB); a larger one stays local (one warning)."""
    value = env_int("LAZYTRITON_REMOTE_CACHE_MAX_ENTRY", DEFAULT_REMOTE_MAX_ENTRY_BYTES, minimum=1)
    assert value is not None
    return value
