"""Safe on-disk store for compiled binaries and tuning records.

- the settings (Settings, settings()) are lazytriton.settings, re-exported here;
- entries.py: what is stored (CompiledBinary, TuningRecord) and its framing;
- files.py: atomic publish by rename, bounded advisory locks;
- store.py: the Cache (layout, degradation to memory, management);
- archive.py: export/import of entries as a verified .tar.gz archive;
- measurements.py: each config's measured time, apart from the config list;
- verdicts.py: each binary's isolated first launch (ran clean, faulted, hung), per binary;
- remote/: the fleet's server behind the local cache (LAZYTRITON_REMOTE_CACHE).
"""

from .archive import ARCHIVE_FORMAT
from ..settings import Settings, default_cache_dir, settings
from .entries import (KIND_BINARY, KIND_RECORD, MAGIC, BadEntry, CompiledBinary, EntryInfo, TuningRecord,
                      decode_binary, decode_record, encode_binary, encode_record)
from .files import STALE_TEMP_AGE_S, atomic_write
from .store import USED_KEYS_ENV, Cache, get_cache

__all__ = ["ARCHIVE_FORMAT", "Settings", "default_cache_dir", "settings", "KIND_BINARY", "KIND_RECORD", "MAGIC",
           "BadEntry", "CompiledBinary", "EntryInfo", "TuningRecord", "decode_binary", "decode_record",
           "encode_binary", "encode_record", "STALE_TEMP_AGE_S", "atomic_write", "USED_KEYS_ENV", "Cache",
           "get_cache"]
