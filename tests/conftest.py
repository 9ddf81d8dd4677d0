import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Test the installed package, not the source tree (which has no built _core):
# `python -m pytest` puts the current directory first on sys.path.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]

# JAX GPU tests run with every FFI call captured into command buffers (CUDA
# graphs), as the JAX issue asks; JAX must not take the memory CuPy tests use.
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                                   "--xla_gpu_graph_min_graph_size=1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# The tests never touch the user's caches: the session, and every process it
# starts, uses a private lazytriton cache (launch stubs included) unless a test
# takes its own (the cache_dir fixture).
SESSION_CACHE = tempfile.mkdtemp(prefix="lazytriton-tests-")
os.environ["LAZYTRITON_CACHE_DIR"] = SESSION_CACHE
atexit.register(shutil.rmtree, SESSION_CACHE, True)

import lazytriton  # noqa: E402


def _have_gpu() -> bool:
    ok, _ = lazytriton.gpu_available()
    if not ok:
        return False
    try:
        import cupy  # noqa: F401  (GPU tests use CuPy arrays)
    except ImportError:
        return False
    return True


HAVE_GPU = _have_gpu()


def _spread_heavy(items: list) -> None:
    """Under pytest-xdist (-n N), one heavy test at the head of each worker's first run of tests.
    xdist's load scheduler first hands every worker a run of consecutive tests (a quarter of an
    even share), then the rest in order as workers free up: heavy tests side by side in the
    collection (a sweep's parts, a module of sequences) would run one after another on one
    worker and end the run alone. Every worker collects, so every worker orders alike."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    heavy = [item for item in items if item.get_closest_marker("heavy") is not None]
    if workers < 2 or not heavy:
        return
    light = [item for item in items if item.get_closest_marker("heavy") is None]
    run = max(2, len(items) // workers // 4)  # xdist's first run per worker (LoadScheduling)
    spread = []
    for item in heavy:
        spread.append(item)
        spread.extend(light[:run - 1])
        del light[:run - 1]
    items[:] = spread + light


def pytest_collection_modifyitems(config, items):
    _spread_heavy(items)
    if HAVE_GPU:
        return
    reason = "needs an NVIDIA GPU, its driver and CuPy: " + (lazytriton.gpu_available()[1] or "CuPy missing")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


_TIMELINE = os.environ.get("LAZYTRITON_TEST_TIMELINE")  # a file: each test's start and end, per worker


if _TIMELINE:
    import json
    import time

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start = time.time()
        yield
        with open(_TIMELINE, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                                "start": start, "end": time.time()}) + "\n")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private lazytriton cache for one test."""
    d = tmp_path / "ltcache"
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(d))
    import lazytriton.cache.store as store
    monkeypatch.setattr(store, "_default", None)
    return d


@pytest.fixture
def jax_gpu():
    """JAX with a GPU backend (the test skips otherwise)."""
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU backend here")
    return jax


def build_c(tmp_path_factory, source: str, output: str, *flags: str) -> Path:
    """tests/<source> built as a shared object tmp/<output> (the test skips without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    out = tmp_path_factory.mktemp(Path(output).stem.replace(".", "-")) / output
    subprocess.run([cc, "-shared", "-fPIC", "-O1", *flags, "-o", str(out), str(Path(__file__).parent / source)],
                   check=True)
    return out


@pytest.fixture(scope="session")
def native_arrays(tmp_path_factory):
    """tests/native/arrays.c built and imported: array types written in C (C getters, slots, methods)."""
    import importlib.util
    import sysconfig

    so = build_c(tmp_path_factory, "native/arrays.c", f"native_arrays{sysconfig.get_config_var('EXT_SUFFIX')}",
                 f"-I{sysconfig.get_paths()['include']}")
    spec = importlib.util.spec_from_file_location("native_arrays", so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fake_driver(tmp_path_factory):
    """A directory holding fake_cuda/fake_cuda.c built as libcuda.so.1 (a recording stand-in for the driver)."""
    return build_c(tmp_path_factory, "fake_cuda/fake_cuda.c", "libcuda.so.1").parent
