"""The remote cache tier (LAZYTRITON_REMOTE_CACHE): a server shared by a fleet,
behind every host's local cache.

- backend.py: the key-value interface a server must offer (get, put, delete, scan) and its faults;
- redis_backend.py: that interface on Redis (the official client, `lazytriton[redis]`);
- tier.py: keys, envelopes and checks, fault handling, publishing, management.
"""

from .backend import Backend, Misconfigured, Refused, RemoteError, Unavailable, open_backend, redact
from .tier import NAMESPACE, Foreign, RemoteCache, RemoteEntry, from_settings

__all__ = ["Backend", "Misconfigured", "Refused", "RemoteError", "Unavailable", "open_backend", "redact", "NAMESPACE", "Foreign",
           "RemoteCache", "RemoteEntry", "from_settings"]
