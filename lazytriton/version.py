"""lazytriton's version, read once from its installed metadata (the package's __version__ and
every cache key's part; reading it searches sys.path: 60-90 ms)."""
from __future__ import annotations

try:
    from importlib.metadata import version as _version

    __version__ = _version("lazytriton")
except Exception:  # running from a source tree
    __version__ = "0+unknown"
