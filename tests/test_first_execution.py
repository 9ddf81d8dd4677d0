"""What a JAX program's first execution waits for (no GPU needed): the XLA FFI
handler prebuilt with the package is used when it matches the jaxlib in use
(no compiler), and the call key of a first execution comes from a stub that is
already there (no stub build started)."""
import json
import os
import subprocess
import sys

from lazytriton.jax import ffi as jax_ffi
from lazytriton import paths
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DTYPE_IDS, DeviceArray
from lazytriton.model.specialize import Shape, Slot

PREBUILT = paths.runtime_library().parent / "lt_jax_ffi.json"


def test_call_key_without_starting_a_stub_build(tmp_path, monkeypatch):
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path))
    shape = Shape(("q", "m"), (Slot("ptr", dtype=DTYPE_IDS["fp16"]), Slot("int", int_type="i64", in_key=True)))
    args = (DeviceArray(0x7F0000000010, "fp16", 64), 2**40)
    stub = stubgen.stub_if_built(shape)
    assert type(stub).__name__ == "Stub"  # the table-driven one
    assert f"lt_stub_{shape.digest()}" not in stubgen._building
    assert not list(tmp_path.rglob("lt_stub_*"))  # nothing written, nothing compiled
    key = stub.key(args)
    built = stubgen.load_stub(shape)  # once built (by a launch, in the background), that one serves
    assert stubgen.stub_if_built(shape) is built and built.key(args) == key


def test_prebuilt_handler_only_for_its_jaxlib():
    src = paths.jax_handler_source().read_text()
    assert jax_ffi._prebuilt_handler("lt_jax_ffi", src, "0.0.0-another-jaxlib") is None
    assert jax_ffi._prebuilt_handler("lt_jax_ffi", src + "// edited\n", _jaxlib_version()) is None


def _jaxlib_version() -> str:
    import jaxlib

    return jaxlib.__version__


def test_handler_ready_in_a_fresh_process(tmp_path):
    """Fresh cache: the prebuilt handler (when the package was built beside this
    jaxlib) loads with no compiler; otherwise it is built into the cache."""
    code = ("import json; from lazytriton.jax import ffi as jax_ffi; m = jax_ffi.handler_module(); "
            "assert set(m.handlers()) == {'instantiate', 'execute'}; print(json.dumps(jax_ffi.handler_info()))")
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    info = json.loads(p.stdout.strip().splitlines()[-1])
    built_here = list(tmp_path.rglob("lt_jax_ffi*.so"))
    prebuilt_ok = PREBUILT.exists() and json.loads(PREBUILT.read_text())["jaxlib"] == _jaxlib_version()
    if prebuilt_ok:
        assert info["how"] == "prebuilt" and not built_here, (info, built_here)
        assert info["seconds"] < 1.0
    else:
        assert info["how"] == "built" and built_here, (info, built_here)
