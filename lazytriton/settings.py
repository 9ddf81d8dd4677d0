"""User settings: every LAZYTRITON_* environment variable is read here, and nowhere
else.  `import lazytriton` checks them all once (check_environment): a bad value
is a SettingError naming the variable, its value and what it takes; an unset or
empty one is the default; an unknown name close to a setting's is said once.
The accessors read the environment at each use (not cached), so that a value
set later (tests, the harness) is the one used, checked again."""

from __future__ import annotations

import dataclasses
import difflib
import logging
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
    - online: True when LAZYTRITON_TUNING=online: kernels whose `tuning=` says
      nothing tune online (tuning_mode()).
    """

    cache_dir: Path
    disk_cache: bool = True
    retune: bool = False
    tuning: bool = True
    online: bool = False


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
        tuning=tuning_mode() != "off",
        online=tuning_mode() == "online",
    )


TUNING_MODES = ("first_call", "online", "off")


def tuning_mode() -> str:
    """LAZYTRITON_TUNING: how a kernel whose `tuning=` says nothing is tuned. "first_call" (default;
    also 1/true/yes/on): compiled and timed on the first call of each specialization; "online": the
    first call waits for one compile and launches it, the calls that follow time one candidate
    each until the fastest is known (lazytriton/runtime/online.py); "off" (also 0/false/no):
    no timing, the first config left after pruning."""
    raw = _raw("LAZYTRITON_TUNING")
    if raw is None:
        return "first_call"
    value = raw.strip().lower()
    if value in _TRUE or value == "first_call":
        return "first_call"
    if value in _FALSE:
        return "off"
    if value == "online":
        return "online"
    raise SettingError("LAZYTRITON_TUNING", raw, "'first_call' (also 1, true, yes, on), 'online' or 'off' (also 0, "
                       "false, no)")


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
    raw = _raw("LAZYTRITON_FLUSH_L2")
    value = raw.strip().lower() if raw is not None else "auto"
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    if value != "auto":
        raise SettingError("LAZYTRITON_FLUSH_L2", str(raw), f"'auto' or {_FLAG}")
    return None


def prebuilt_handler() -> bool:
    """LAZYTRITON_PREBUILT_HANDLER=0: build the XLA FFI handler against the jaxlib in use."""
    return env_flag("LAZYTRITON_PREBUILT_HANDLER", True)


def capture_fallback() -> str:
    """LAZYTRITON_CAPTURE_FALLBACK: what a JAX call site first executed under capture does."""
    return env_choice("LAZYTRITON_CAPTURE_FALLBACK", ("record", "first_config"), "record")


DEFAULT_ISOLATION_TIMEOUT_S = 10.0


def isolation() -> bool:
    """LAZYTRITON_ISOLATION: a candidate's first launch (a binary never launched before) runs once in
    a helper process with a CUDA context of its own, on copies of the call's buffers, before this
    process launches it (lazytriton.runtime.isolation); 0: it launches here at once."""
    return env_flag("LAZYTRITON_ISOLATION", True)


def isolation_timeout() -> float:
    """LAZYTRITON_ISOLATION_TIMEOUT: seconds a candidate's isolated first launch may run (default 10)
    before it is abandoned as hung (its helper process is killed) and persisted as failed."""
    value = env_seconds("LAZYTRITON_ISOLATION_TIMEOUT", DEFAULT_ISOLATION_TIMEOUT_S)
    if value == 0:
        raise SettingError("LAZYTRITON_ISOLATION_TIMEOUT", os.environ["LAZYTRITON_ISOLATION_TIMEOUT"],
                           "a number of seconds > 0")
    return value


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


# -- the cache's locks, agreement between processes, the driver (read by the C++ core too) ----------

DEFAULT_LOCK_TIMEOUT_S = 600.0
DEFAULT_AGREE_TIMEOUT_S = 600.0


def cache_locks() -> bool:
    """LAZYTRITON_CACHE_LOCKS=0: no flock around a first call's tuning (one process tunes each key
    otherwise; a filesystem without flock works either way)."""
    return env_flag("LAZYTRITON_CACHE_LOCKS", True)


def cache_lock_timeout() -> float:
    """LAZYTRITON_CACHE_LOCK_TIMEOUT: seconds a first call waits for another process's lock on its
    key (default 600) before tuning without it."""
    return env_seconds("LAZYTRITON_CACHE_LOCK_TIMEOUT", DEFAULT_LOCK_TIMEOUT_S)


def agree() -> bool:
    """LAZYTRITON_AGREE=0: processes of one job do not agree on one winner (lazytriton.distributed)."""
    return env_flag("LAZYTRITON_AGREE", True)


def agree_timeout() -> float:
    """LAZYTRITON_AGREE_TIMEOUT: seconds a process waits for another's winner (default 600)."""
    return env_seconds("LAZYTRITON_AGREE_TIMEOUT", DEFAULT_AGREE_TIMEOUT_S)


def used_keys_dir() -> Optional[str]:
    """LAZYTRITON_USED_KEYS: where `lazytriton pretune` has a program note the tuning records it used
    (set by the CLI for its child, not by users)."""
    return _raw("LAZYTRITON_USED_KEYS")


def driver() -> Optional[str]:
    """LAZYTRITON_DRIVER=cuda|hip: only that driver is loaded (C++ core, csrc/core/driver.cc)."""
    raw = _raw("LAZYTRITON_DRIVER")
    if raw is not None and raw not in ("cuda", "hip"):  # the C++ core takes exactly these words
        raise SettingError("LAZYTRITON_DRIVER", raw, "'cuda' or 'hip'")
    return raw


def device() -> Optional[int]:
    """LAZYTRITON_DEVICE: the device a thread with no current context uses (C++ core); None: device 0."""
    return env_int("LAZYTRITON_DEVICE", None)


def file_in_the_way(path: Path) -> Optional[Path]:
    """The file at `path` or above it that keeps `path` from being a directory, or None."""
    above = next((p for p in (path, *path.parents) if p.exists()), None)
    return above if above is not None and not above.is_dir() else None


def cache_dir() -> Path:
    """default_cache_dir(), refused where it cannot be a directory (a file there or above it)."""
    path = default_cache_dir()
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise SettingError("LAZYTRITON_CACHE_DIR", str(_raw("LAZYTRITON_CACHE_DIR") or path),
                           f"a directory ({blocker} is a file)")
    return path


# -- every setting, checked at once (import lazytriton) --------------------------------------------

# Read by the C++ side only (a path each, nothing to check here): named so that a typo is caught.
_CPP_ONLY = ("LAZYTRITON_BUNDLE", "LAZYTRITON_PYTHON", "LAZYTRITON_LIBHIP")
# The harness's and the tests' own variables: not settings, never a typo.
_NOT_SETTINGS = ("LAZYTRITON_USED_KEYS", "LAZYTRITON_BENCH_WORK", "LAZYTRITON_BENCH_WORKLOADS",
                 "LAZYTRITON_BENCH_WRAP_GAP_S", "LAZYTRITON_TRITON_VENVS", "LAZYTRITON_FULL_MATRIX",
                 "LAZYTRITON_MATRIX_REPORT", "LAZYTRITON_TEST_TIMELINE", "LAZYTRITON_DIFFERENTIAL_CALLS",
                 "LAZYTRITON_DIFFERENTIAL_SEED", "LAZYTRITON_FIELD_STEPS", "LAZYTRITON_FIELD_SEED",
                 "LAZYTRITON_FIELD_PARTS", "LAZYTRITON_FIELD_QUICK", "LAZYTRITON_FIELD_COUNTS",
                 "LAZYTRITON_FIELD_TE_DIR")

CHECKS = {  # every setting and the accessor that reads and checks it
    "LAZYTRITON_CACHE_DIR": cache_dir,
    "LAZYTRITON_CACHE": settings,
    "LAZYTRITON_RETUNE": settings,
    "LAZYTRITON_TUNING": tuning_mode,
    "LAZYTRITON_CACHE_LOCKS": cache_locks,
    "LAZYTRITON_CACHE_LOCK_TIMEOUT": cache_lock_timeout,
    "LAZYTRITON_COMPILE_WORKERS": compile_workers,
    "LAZYTRITON_COMPILE_AHEAD": compile_ahead,
    "LAZYTRITON_STUB_BUILD": stub_build,
    "LAZYTRITON_FLUSH_L2": flush_l2,
    "LAZYTRITON_PREBUILT_HANDLER": prebuilt_handler,
    "LAZYTRITON_CAPTURE_FALLBACK": capture_fallback,
    "LAZYTRITON_ISOLATION": isolation,
    "LAZYTRITON_ISOLATION_TIMEOUT": isolation_timeout,
    "LAZYTRITON_DEFAULT_ARCH": lambda: default_arch(90),
    "LAZYTRITON_AGREE": agree,
    "LAZYTRITON_AGREE_TIMEOUT": agree_timeout,
    "LAZYTRITON_DRIVER": driver,
    "LAZYTRITON_DEVICE": device,
    "LAZYTRITON_REMOTE_CACHE": remote_cache_url,
    "LAZYTRITON_REMOTE_CACHE_TIMEOUT": remote_cache_timeout,
    "LAZYTRITON_REMOTE_CACHE_RETRY_AFTER": remote_cache_retry_after,
    "LAZYTRITON_REMOTE_CACHE_TTL": remote_cache_ttl,
    "LAZYTRITON_REMOTE_CACHE_MAX_ENTRY": remote_cache_max_entry,
}


def check_environment() -> None:
    """Check every LAZYTRITON_* variable set now: the first bad value raises its SettingError; an
    unknown name close to a setting's is said (a warning, once: this runs once, at import)."""
    for name, read in CHECKS.items():
        if _raw(name) is not None:
            read()
    known = (*CHECKS, *_CPP_ONLY)
    for name in sorted(os.environ):
        if name.startswith("LAZYTRITON_") and name not in known and name not in _NOT_SETTINGS:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
            if close:
                logging.getLogger("lazytriton").warning("%s is not a lazytriton setting (ignored): did you mean %s?",
                                                        name, close[0])
