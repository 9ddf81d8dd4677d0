"""C++ extension modules built at run time against lazytriton's headers and
library (the generated launch stubs, the XLA FFI handler, test and benchmark
modules), cached on disk per toolchain, built once per process and module, and
checked before they are loaded."""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from .. import paths
from .. import settings
from ..cache import files

log = logging.getLogger("lazytriton.runtime.native")

def _toolchain_tag() -> str:
    """Stubs are rebuilt whenever anything they compile against changes."""
    import pybind11

    here = Path(__file__).parent
    h = hashlib.sha256((here / "stubgen.py").read_bytes())  # the stub generator
    h.update((here.parent / "model" / "specialize.py").read_bytes())  # the slot types it generates from
    h.update(Path(__file__).read_bytes())  # how modules are built
    for f in [*sorted(paths.include_dir().rglob("*.h")), *sorted(paths.stub_source_dir().glob("*.h"))]:
        h.update(f.read_bytes())
    h.update(sys.version.encode())
    h.update(pybind11.__version__.encode())
    h.update(paths.runtime_library().read_bytes()[:4096])
    return h.hexdigest()[:12]


_loaded: dict[str, object] = {}
_lock = threading.Lock()


def compile_command(source: Path, output: Path, extra_flags: tuple[str, ...] = ()) -> list[str]:
    import pybind11

    cxx = os.environ.get("CXX", "c++")
    libdir = paths.runtime_library().parent
    return [*shlex.split(cxx), "-O2", "-shared", "-fPIC", "-std=c++17", "-fvisibility=hidden",
            f"-I{paths.include_dir()}", f"-I{paths.stub_source_dir()}", f"-I{pybind11.get_include()}",
            f"-I{sysconfig.get_paths()['include']}",
            # extra_flags after the source: their libraries must follow what uses them (--as-needed).
            str(source), "-o", str(output), *extra_flags, f"-L{libdir}", "-llazytriton", f"-Wl,-rpath,{libdir}"]


# -- the on-disk stub cache ---------------------------------------------------------
#
# <cache>/stubs/<toolchain tag>/<name><EXT_SUFFIX> is published by rename from a
# temp file in the same directory, and only after its checksum file
# (<name><EXT_SUFFIX>.sha256: size and sha256) is in place: a module is loaded
# only if it matches its checksum, so a file cut short (disk full, a killed
# build, a bad copy) is never dlopen'ed; it is discarded with one warning and
# rebuilt. Temp files are removed when a build fails or the process exits, and
# those a killed process left behind are swept by the next build.

_SUM = ".sha256"
_TEMP = ".tmp"


def stubs_root(cache_root: Path | None = None) -> Path:
    """Where the built stubs (and the XLA FFI handler built on first use) live."""
    return (paths.cache_root() if cache_root is None else Path(cache_root)) / "stubs"


def clear_stubs(cache_root: Path | None = None) -> int:
    """Removes every built module under the cache (`lazytriton cache clear`);
    returns how many there were. Processes that loaded one keep it."""
    root = stubs_root(cache_root)
    if not root.is_dir():
        return 0
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    count = sum(1 for _ in root.glob(f"*/*{ext}"))
    shutil.rmtree(root, ignore_errors=True)
    return count


def _stub_dir(tag: str = "") -> Path:
    global _tag
    if _tag is None:
        _tag = _toolchain_tag()
    return stubs_root() / (_tag + tag)


_tag: str | None = None


def _built_path(name: str, tag: str = "") -> Path:
    return _stub_dir(tag) / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"


def _digest(path: Path) -> str:
    data = path.read_bytes()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def _verified(so: Path) -> str | None:
    """None if `so` is a complete build (matches its checksum file), else why not."""
    try:
        actual = _digest(so)
    except FileNotFoundError:
        return "not built"
    except OSError as exc:
        return f"unreadable ({exc})"
    try:
        expected = so.with_name(so.name + _SUM).read_text().strip()
    except OSError:
        return "it has no checksum file (a build that did not finish, or a copy)"
    if actual != expected:
        return f"it is {actual.split()[0]} bytes with another checksum than the build wrote ({expected.split()[0]} bytes)"
    return None


_private: Path | None = None
_warned_dirs: set[Path] = set()


def _writable(d: Path) -> Path:
    """`d`, made if needed; where it cannot be written (LAZYTRITON_CACHE_DIR a
    file, read-only, ...), a directory private to this process, with one
    warning: the stubs then build in every process, the calls still work."""
    global _private
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK | os.X_OK):
            return d
        why: object = "permission denied"
    except OSError as exc:
        why = exc
    with _lock:
        if _private is None:
            _private = Path(tempfile.mkdtemp(prefix="lazytriton-stubs-"))
            atexit.register(shutil.rmtree, _private, True)
        if d not in _warned_dirs:
            _warned_dirs.add(d)
            log.warning("cannot write launch stubs to %s (%s); building them in %s for this process only (set "
                        "LAZYTRITON_CACHE_DIR to a writable directory; it is %s)", d, why, _private,
                        settings.default_cache_dir())
    out = _private / d.name
    out.mkdir(exist_ok=True)
    return out


def load_module(name: str, source: Callable[[], str], what: str, extra_flags: tuple[str, ...] = (),
                tag: str = "", background: bool = False, outlive: bool = False):
    """A Python extension module built from `source()` against lazytriton's
    headers and library, cached on disk per toolchain (and `tag`). Builds of
    different modules run concurrently; one module is built once. A
    `background` build (a launch stub while the table-driven one serves the
    calls) runs its compiler niced: it must not slow the candidates' compile
    that the first call waits for. A build that may `outlive` this process (one
    that takes longer than a short script runs: the torch reader) runs in a
    builder process of its own, which publishes the module even if this
    process has ended meanwhile; other builds stop when the process ends."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        lock = _name_locks.setdefault(name, threading.Lock())
    with lock:
        module = _loaded.get(name)
        if module is not None:
            return module
        so = _built_path(name, tag)
        if _verified(so) is not None:  # a read-only cache holding a good build is fine
            so = _writable(so.parent) / so.name
            (_build_detached if outlive else _build)(name, source, so, what, extra_flags, background)
        try:
            module = _import(name, so)
        except ImportError as exc:  # matches its checksum but does not load: rebuild it once
            so = _writable(so.parent) / so.name
            (_build_detached if outlive else _build)(name, source, so, what, extra_flags, background,
                                                     broken=f"it does not load ({exc})")
            try:
                module = _import(name, so)
            except ImportError as again:
                raise RuntimeError(f"{what}: the module built at {so} does not load: {again}") from again
        with _lock:
            _loaded[name] = module
        return module


_name_locks: dict[str, threading.Lock] = {}
_in_flight: dict[str, subprocess.Popen | None] = {}  # temp file -> its compiler, until published
_exiting = False
_swept: set[Path] = set()


def _build(name: str, source: Callable[[], str], so: Path, what: str, extra_flags: tuple[str, ...],
           background: bool = False, broken: str | None = None) -> None:
    with open(so.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds, the others reuse
        _sweep(so)
        problem = broken or _verified(so)
        if problem is None:
            return
        if problem != "not built":
            log.warning("%s: discarding %s: %s; rebuilding it", what, so, problem)
            for f in (so, so.with_name(so.name + _SUM)):
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()
        src = so.parent / f"{name}.cc"
        src.write_text(source())
        tmp = so.parent / f".{so.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{_TEMP}"
        cmd = compile_command(src, tmp, extra_flags)
        if background and shutil.which("nice"):
            cmd = ["nice", "-n", "10", *cmd]
        # The compiler's own temp files (cc*.s, cc*.o) in a directory of the build's, removed with
        # its output: a compiler stopped at exit (_stop_builds) cannot remove them from $TMPDIR.
        work = _work_dir(tmp)
        env = dict(os.environ, TMPDIR=str(work))
        log.info("building %s", what)
        t0 = time.perf_counter()
        try:
            with _lock:
                if _exiting:
                    raise RuntimeError(f"{what}: not built, the process is exiting")
                work.mkdir()
                # A session of its own: stopping the build stops the compiler's children too.
                try:
                    _in_flight[str(tmp)] = proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                                                   stderr=subprocess.PIPE, text=True,
                                                                   start_new_session=True, env=env)
                except OSError as exc:  # no compiler there: the reason in one line, not a traceback
                    raise RuntimeError(f"building {what} failed: cannot run the C++ compiler {cmd[0]!r} "
                                       f"($CXX, else c++): {exc.strerror or exc}") from None
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"building {what} failed:\n{' '.join(cmd)}\n{err[-4000:]}")
            # The checksum first: a module without one is never loaded.
            files.atomic_write(so.with_name(so.name + _SUM), _digest(tmp).encode())
            os.replace(tmp, so)
        finally:
            with _lock:
                _in_flight.pop(str(tmp), None)
            _remove(tmp)
            _remove(work)
        log.info("built %s in %.2fs", what, time.perf_counter() - t0)


def _work_dir(tmp: Path) -> Path:
    """The compiler's temp directory of the build writing `tmp` (a _TEMP name: swept like it)."""
    return tmp.with_name(tmp.name[:-len(_TEMP)] + ".work" + _TEMP)


def _remove(path: Path) -> None:
    """A temp file or directory of a build, if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _build_detached(name: str, source: Callable[[], str], so: Path, what: str, extra_flags: tuple[str, ...],
                    background: bool = False, broken: str | None = None) -> None:
    """_build in a builder process of its own (`python -m lazytriton.runtime.native`), in a session of its
    own: this process waits for it, but does not stop it when it exits, and the builder publishes the
    module for the next process."""
    so.parent.mkdir(parents=True, exist_ok=True)
    src = so.parent / f"{name}.cc"
    files.atomic_write(src, source().encode())
    job = {"name": name, "so": str(so), "what": what, "flags": list(extra_flags), "background": background,
           "broken": broken}
    with _lock:
        if _exiting:
            raise RuntimeError(f"{what}: not built, the process is exiting")
    proc = subprocess.Popen([sys.executable, "-m", "lazytriton.runtime.native", json.dumps(job)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=str(so.parent))  # not this process's: its directory may be a package's checkout
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(err.strip().splitlines()[-1] if err.strip() else f"{what}: the builder failed "
                           f"(exit status {proc.returncode})")


def _builder_main(job: dict) -> int:
    """The builder process of _build_detached."""
    so = Path(job["so"])
    text = (so.parent / f"{job['name']}.cc").read_text()
    try:
        _build(job["name"], lambda: text, so, job["what"], tuple(job["flags"]), job["background"], job["broken"])
    except Exception as exc:  # noqa: BLE001  (the parent raises it, by its last line)
        print(f"{exc}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


def _sweep(so: Path) -> None:
    """Under the build lock of `so`: its temp files are a dead build's; once
    per directory, any temp file older than an hour is too."""
    for f in so.parent.glob(f".{so.name}.*{_TEMP}"):
        _remove(f)
    if so.parent in _swept:
        return
    _swept.add(so.parent)
    now = time.time()
    for f in so.parent.glob(f"*{_TEMP}"):
        with contextlib.suppress(FileNotFoundError):
            if now - f.stat().st_mtime > files.STALE_TEMP_AGE_S:
                _remove(f)


@atexit.register
def _stop_builds() -> None:
    """A process that ends while a stub builds leaves no temp file: its
    compiler is stopped and the file removed (the next process builds it)."""
    global _exiting
    with _lock:
        _exiting = True
        pending = list(_in_flight.items())
    for tmp, proc in pending:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the driver and cc1plus, as, ld under it
            proc.wait()
        _remove(Path(tmp))
        _remove(_work_dir(Path(tmp)))


def is_built(name: str, tag: str = "") -> bool:
    """Whether load_module(name, ..., tag=tag) would find the module built."""
    return _built_path(name, tag).exists()


def load_prebuilt(name: str, so: Path):
    """A module built elsewhere (with the package), imported once per process
    under `name` as load_module would import it."""
    with _lock:
        module = _loaded.get(name)
        if module is None:
            module = _loaded[name] = _import(name, so)
    return module


def _import(name: str, so: Path):
    loader = importlib.machinery.ExtensionFileLoader(name, str(so))
    spec = importlib.util.spec_from_file_location(name, so, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def loaded(name: str):
    """The module `name` if this process has loaded it, else None."""
    return _loaded.get(name)


def built_and_intact(name: str, tag: str = "") -> bool:
    """Whether load_module(name, ..., tag=tag) would load a finished build (no compiler)."""
    return _verified(_built_path(name, tag)) is None


def exiting() -> bool:
    """Whether the process is exiting (builds are being stopped)."""
    return _exiting


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(_builder_main(json.loads(sys.argv[1])))
