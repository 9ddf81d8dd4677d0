"""File operations the cache relies on, chosen to be safe on a directory shared
by many hosts (NFS, Lustre, GPFS...):

- publish = write a unique temp file in the target directory, fsync, rename:
  rename within one directory is atomic on local filesystems and on NFS, so a
  reader sees the old entry or the whole new one, never a partial one. The
  fsyncs (file, then directory) only make an entry survive a power cut: every
  file carries a checksum, so one cut short is a miss, never a wrong entry.
  The small documents beside the entries (measurements, verdicts: nine on a
  first call of four candidates, each fsync 0.2 ms on a local disk and more on
  a shared one, on the call's path) are published without them: a crash can
  lose one, and its configs are then measured or isolated again;
- temp names carry the pid and a random part, so writers on different hosts
  never share one;
- file locks only avoid duplicated work, never guard correctness: a lock that
  the filesystem does not support is skipped, a wait is bounded.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

log = logging.getLogger("lazytriton.cache")

TEMP_SUFFIX = ".tmp"
STALE_TEMP_AGE_S = 3600.0
_WRITE_CHUNK = 1 << 20

# Test hook: called as hook(temp_path, bytes_written) after each chunk of an
# entry write.  Lets a test kill a writer at a precise point.
_chunk_hook: Optional[Callable[[str, int], None]] = None


def fsync_dir(path: Path) -> None:
    # Makes the rename durable; best effort (not all filesystems allow it).
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one;
    `durable`: on disk before this returns (fsync), not only in the page cache."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}"
    # 0o666 & ~umask, like a normal file, so shared caches stay shareable.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:written + _WRITE_CHUNK])
            if _chunk_hook is not None:
                _chunk_hook(str(tmp), written)
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def read_file(path: Path) -> tuple[bytes, os.stat_result]:
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        return f.read(), st


def same_file(path: Path, st: os.stat_result) -> bool:
    try:
        now = os.stat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def is_temp(name: str) -> bool:
    return name.endswith(TEMP_SUFFIX)


# --------------------------------------------------------------------------
# Advisory locks
# --------------------------------------------------------------------------

_unsupported_warned = False


def flock_bounded(fd: int, what: str, timeout_s: float, sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> bool:
    """Take an exclusive flock on ``fd``, waiting at most ``timeout_s``.

    True: locked.  False: not locked (unsupported by the filesystem, or the
    wait ran out) and the caller goes on without it, which is safe: the lock
    only spares duplicate work, entries are published by rename.  Polls with
    LOCK_NB instead of blocking, because a blocking flock on a network
    filesystem can hang for as long as a dead client's lease lasts.
    """
    global _unsupported_warned
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.EBADF):
            if not _unsupported_warned:  # a property of the filesystem: say it once
                _unsupported_warned = True
                log.warning("file locks are not supported in the lazytriton cache directory (%s); continuing "
                            "without cross-process locks (safe: entries are published by atomic rename; "
                            "processes may compile or tune the same kernel twice)", exc)
        else:
            log.warning("cannot lock %s (%s); continuing without a cross-process lock", what, exc)
        return False
    log.info("waiting for another process working on %s...", what)
    deadline = clock() + timeout_s
    delay = 0.01
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            log.warning("gave up waiting %.0f s for the lock on %s (LAZYTRITON_CACHE_LOCK_TIMEOUT); continuing "
                        "without it: this process may repeat work another one is doing", timeout_s, what)
            return False
        sleep(min(delay, remaining))
        delay = min(delay * 2, 0.5)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            continue
        except OSError as exc:
            log.warning("cannot lock %s (%s); continuing without a cross-process lock", what, exc)
            return False


def remove_unheld_lock(path: Path) -> bool:
    """Remove a lock file no process holds (taken without waiting, removed while held); a held
    one stays: its holder is still working. Removing a lock file is safe: at worst two
    processes then do the same work (see flock_bounded)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink()
        return True
    except OSError:  # held by another process (or this one), gone, or locks unsupported
        return False
    finally:
        os.close(fd)
