"""Broken state and careless input (issue 25): every failure names its cause,
and the runtime heals what it wrote itself.

The first-call tests run real processes against fake_cuda/fake_cuda.c (a
recording stand-in for libcuda.so.1): real Triton compiles, real tuning
(with the fake driver's timings), real records, binaries and launch stubs on
disk, so broken files, killed processes and short memory are checked on the CPU."""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest
import triton
import triton.language as tl

import lazytriton
from lazytriton import cli
from lazytriton import settings

HERE = Path(__file__).resolve().parent
EXT = sysconfig.get_config_var("EXT_SUFFIX")

# -- settings ------------------------------------------------------------------------------


def _workers():
    from lazytriton.compile.pool import default_workers

    return default_workers()


def _target():
    from lazytriton.compile.targets import default_target

    return default_target()


def _tune_options():
    from lazytriton.runtime.tuner import TuneOptions

    return TuneOptions()


SETTINGS = [  # (variable, bad value, what reads it, words of what it takes)
    ("LAZYTRITON_COMPILE_WORKERS", "abc", _workers, "integer >= 0"),
    ("LAZYTRITON_COMPILE_WORKERS", "-2", _workers, "integer >= 0"),
    ("LAZYTRITON_DEFAULT_ARCH", "hopper", _target, "AMD architecture (gfx90a, gfx942"),
    ("LAZYTRITON_DEFAULT_ARCH", "7", _target, "an NVIDIA compute capability, as 90 or sm_90 (50, 52"),
    ("LAZYTRITON_DEFAULT_ARCH", "sm_91", _target, "an NVIDIA compute capability"),
    ("LAZYTRITON_DEFAULT_ARCH", "gfx42", _target, "an AMD architecture"),
    ("LAZYTRITON_FLUSH_L2", "maybe", _tune_options, "'auto'"),
    ("LAZYTRITON_CACHE", "perhaps", settings.settings, "1/0"),
    ("LAZYTRITON_RETUNE", "2", settings.settings, "1/0"),
    ("LAZYTRITON_TUNING", "fast", settings.tuning_mode, "'online'"),
    ("LAZYTRITON_STUB_BUILD", "synch", lambda: settings.stub_build_sync(), "'sync'"),
    ("LAZYTRITON_PREBUILT_HANDLER", "nope", lambda: settings.prebuilt_handler(), "1/0"),
    ("LAZYTRITON_CAPTURE_FALLBACK", "first", lambda: settings.capture_fallback(), "'first_config'"),
    ("LAZYTRITON_CACHE_LOCK_TIMEOUT", "-1", lambda: settings.env_seconds("LAZYTRITON_CACHE_LOCK_TIMEOUT", 1.0),
     "seconds >= 0"),
]


@pytest.mark.parametrize("arch, backend, target", [("90", "cuda", 90), ("sm_80", "cuda", 80), ("SM120", "cuda", 120),
                                                  ("75", "cuda", 75), ("gfx942", "hip", "gfx942"),
                                                  ("gfx942:sramecc+:xnack-", "hip", "gfx942"),
                                                  ("gfx1100", "hip", "gfx1100")])
def test_default_arch_takes_the_targets_triton_compiles_for(monkeypatch, arch, backend, target):
    monkeypatch.setenv("LAZYTRITON_DEFAULT_ARCH", arch)
    assert (_target().backend, _target().arch) == (backend, target)


@pytest.mark.parametrize("var,bad,read,takes", SETTINGS, ids=[f"{v}={b}" for v, b, _, _ in SETTINGS])
def test_a_bad_setting_names_the_variable_its_value_and_what_it_takes(monkeypatch, var, bad, read, takes):
    monkeypatch.setenv(var, bad)
    with pytest.raises(ValueError) as info:
        read()
    msg = str(info.value)
    assert var in msg and repr(bad) in msg and takes in msg, msg
    monkeypatch.setenv(var, "  ")  # empty: the default
    read()


def test_the_cli_reports_a_bad_setting_without_a_traceback(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LAZYTRITON_CACHE", "maybe")
    assert cli.main(["cache", "import", str(tmp_path / "x.tar.gz")]) == 2
    assert "error: LAZYTRITON_CACHE='maybe' is not a valid setting" in capsys.readouterr().err


def test_no_module_but_the_settings_module_reads_a_setting():
    """One module reads and checks every LAZYTRITON_* setting."""
    import re

    pkg = Path(lazytriton.__file__).parent
    offenders = []
    for f in pkg.rglob("*.py"):
        if f == pkg / "settings.py" or "bench" in f.parts:
            continue
        for line in f.read_text().splitlines():
            if re.search(r"(environ(\.get)?|getenv)\W+[\"']LAZYTRITON_(?!USED_KEYS|BENCH)", line):
                offenders.append(f"{f.relative_to(pkg)}: {line.strip()}")
    assert not offenders, offenders


def test_every_setting_is_in_the_readme():
    names = {*settings.CHECKS, *settings._CPP_ONLY}  # every setting (settings.py declares them all)
    readme = (HERE.parent / "README.md").read_text()
    assert names and not [n for n in names if n not in readme], sorted(n for n in names if n not in readme)


# -- the session's own cache -------------------------------------------------------------


def test_a_stub_built_in_a_test_lands_in_the_sessions_cache():
    from lazytriton.runtime import stubgen
    from lazytriton.model.arrays import PointerArg
    from kernels import basic

    k = lazytriton.kernel(basic.add_kernel)
    shape = k._shape((PointerArg(1 << 12, "fp32"),) * 3 + (4096,))
    module = stubgen.load_stub(shape)
    where = Path(module.__file__).resolve()
    assert Path.home().resolve() / ".cache" not in where.parents, where
    assert Path(os.environ["LAZYTRITON_CACHE_DIR"]).resolve() in where.parents, where


def test_pytest_never_writes_to_the_users_cache(tmp_path):
    """A whole pytest run under a HOME of its own leaves nothing in HOME/.cache/lazytriton."""
    env = {k: v for k, v in os.environ.items() if k not in ("LAZYTRITON_CACHE_DIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(tmp_path)
    node = f"{Path(__file__).name}::test_a_stub_built_in_a_test_lands_in_the_sessions_cache"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", node],
                       cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not (tmp_path / ".cache" / "lazytriton").exists(), list((tmp_path / ".cache").rglob("*"))


# -- careless input: JAX out_type, the CLI, export-cpp --------------------------------------


@pytest.mark.parametrize("out_type", [(4096, "float32"), "float32", {"out": 4096}], ids=["tuple", "dtype", "dict"])
def test_jax_out_type_that_is_not_shapes_and_dtypes_is_a_type_error_naming_the_kernel(out_type):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from kernels import basic
    from lazytriton.jax import triton_call

    def f(x, y):
        return triton_call(x, y, kernel=basic.add_kernel, out_type=out_type, n=4096, grid=(4,), BLOCK=1024)

    x = jax.ShapeDtypeStruct((4096,), jnp.float32)
    with pytest.raises(TypeError, match=r"triton_call add_kernel: out_type takes a pytree of objects with \.shape "
                                        r"and \.dtype"):
        jax.jit(f).trace(x, x)


def test_cli_bundle_of_a_missing_path_is_an_error(tmp_path, capsys):
    assert cli.main(["bundle", str(tmp_path / "nonexistent")]) == 1
    assert "no such directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["bundle", str(tmp_path / "empty")]) == 1
    assert "no manifest.json" in capsys.readouterr().err


def test_cli_cache_dir_is_taken_after_the_subcommand_too(tmp_path, capsys):
    for argv in (["cache", "list", "--cache-dir", str(tmp_path)], ["cache", "--cache-dir", str(tmp_path), "list"]):
        assert cli.main(argv) == 0
        assert f"cache: {tmp_path}" in capsys.readouterr().out
    assert cli.main(["cache", "clear", "--cache-dir", str(tmp_path / "x")]) == 0


KERNELS_PY = '''
import triton, triton.language as tl

@triton.jit
def add_kernel(x, y, n, out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    ptrs = out + offs
    tl.store(ptrs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)
'''


def test_export_cpp_refuses_a_signature_that_disagrees_with_the_kernel(tmp_path, monkeypatch, capsys):
    (tmp_path / "ltmismatch_kernels.py").write_text(KERNELS_PY)
    monkeypatch.chdir(tmp_path)  # and the module is found in the current directory
    argv = ["export-cpp", "ltmismatch_kernels:add_kernel", "--constexpr", "BLOCK=1024", "--out-dir", "o"]
    assert cli.main([*argv, "--signature", "*fp32,*fp32,*fp32,i32"]) == 1
    err = capsys.readouterr().err
    assert "kernel add_kernel" in err and "out declared i32 but the kernel uses it as an address" in err, err
    assert "n declared a pointer but never used as an address" in err, err
    assert not (tmp_path / "o").exists()
    assert cli.main([*argv, "--signature", "*fp32,*fp32,i32,*fp32"]) == 0, capsys.readouterr().err
    assert (tmp_path / "o" / "launch_add_kernel.h").exists()


def test_version_typing_marker_and_the_docstrings_a_newcomer_reads(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"lazytriton {lazytriton.__version__}\n"
    assert (Path(lazytriton.__file__).parent / "py.typed").is_file()  # PEP 561: the package's annotations count
    doc = lazytriton.kernel.__doc__
    assert "k[grid](" in doc and "cache:" in doc and "tune_options:" in doc
    import dataclasses

    assert all(f.name in lazytriton.TuneOptions.__doc__ for f in dataclasses.fields(lazytriton.TuneOptions))
    assert "RuntimeError" in lazytriton.RuntimeFailure.__doc__ and "CUDA_ERROR" in lazytriton.RuntimeFailure.__doc__


@triton.jit
def never_compiles(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, BM: tl.constexpr):
    tl.static_assert(BM < 0, "this kernel compiles for no config")


def test_demo_without_a_gpu_says_it_failed_when_nothing_compiled(capsys):
    configs = [triton.Config({"BM": 16}), triton.Config({"BM": 32})]
    assert cli._demo_without_gpu("no GPU in this test", never_compiles, configs) == 1
    out, err = capsys.readouterr()
    assert "None of the 2 candidates compiled for sm_90: the demo failed" in err, err
    assert "On a GPU machine this demo tunes these" not in out, out


@pytest.mark.parametrize("change, error", [
    ({"--signature": "*nonsense,*fp32,i32,*fp32"}, "argument x: unknown element type in '*nonsense'"),
    ({"--signature": "*fp32,*fp32,i8,*fp32"}, "argument n: an unannotated int is i32, i64 or u64"),
    ({"--constexpr": "BLOCK=abc"}, "--constexpr BLOCK=abc: abc is not a number, True, False or None"),
    ({"--out-dir": "afile/o"}, "cannot write the launch functions into --out-dir afile/o"),
    ({"option": "num_warps=banana"}, "num_warps='banana': num_warps takes an int"),
    ({"option": "num_warps=3"}, "num_warps=3: num_warps takes an int, a power of 2"),
], ids=["pointer", "int", "word", "out-dir", "option-type", "option-value"])
def test_export_cpp_refuses_careless_input_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, change,
                                                                        error):
    (tmp_path / "ltcareless_kernels.py").write_text(KERNELS_PY)
    (tmp_path / "afile").write_text("")
    monkeypatch.chdir(tmp_path)
    given = {"--signature": "*fp32,*fp32,i32,*fp32", "--constexpr": "BLOCK=1024", "--out-dir": "o", **change}
    argv = ["export-cpp", "ltcareless_kernels:add_kernel"]
    for flag, value in given.items():
        argv += ["--constexpr" if flag == "option" else flag, value]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and error in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_export_cpp_of_a_module_it_cannot_find_names_its_path_option(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export-cpp", "lt_no_such_module:k", "--signature", "i32"]) == 1
    err = capsys.readouterr().err
    assert "--path DIR" in err and str(tmp_path) in err, err


def test_readmes_cpp_and_jax_examples_agree_on_add_kernel():
    """README's C++ example declares add_kernel's signature; its JAX example
    defines the kernel it calls: the signature must fit that kernel."""
    import re

    from lazytriton.cpp.export import check_addresses

    readme = (HERE.parent / "README.md").read_text()
    sig = re.search(r'bundle\.kernel\("my_kernels:add_kernel", "([^"]+)"', readme).group(1)
    params = re.search(r"# add_kernel\(([^)]*)\)", readme).group(1).split(", ")
    runtime = [p for p in params if p not in ("BLOCK",)]
    types = sig.split(",")
    assert len(types) == len(runtime), (sig, params)
    # The kernel README's usage section defines (add), renamed with the JAX example's parameter order.
    body = re.search(r"def add\(x, y, out, n, BLOCK: tl.constexpr\):\n((?:    .*\n)+)", readme).group(1)
    src = f"def add_kernel({', '.join(runtime)}, BLOCK):\n{body}"
    desc = {"name": "add_kernel"}
    check_addresses(src, desc, list(zip(runtime, types)))  # raises on a disagreement
    export_line = re.search(r'export-cpp my_kernels:add_kernel --signature "([^"]+)"', readme).group(1)
    assert export_line == sig


# -- CPython 3.11: several threads parsing at once ---------------------------------------------


class _Cycle:
    """Cyclic garbage with a finalizer: the collector runs Python code in the
    middle of another thread's parse, which is where the GIL changes hands."""

    def __init__(self):
        self.me = self

    def __del__(self):
        sum(range(20))


def test_tritons_parse_on_many_threads_at_once():
    """CPython 3.11's ast keeps the AST conversion's depth per interpreter:
    threads parsing at once fail with SystemError: AST constructor recursion
    depth mismatch. Triton parses kernels in JITFunction.parse, on lazytriton's
    compile threads (LAZYTRITON_COMPILE_WORKERS=0) and specializer warm-up."""
    from kernels import basic

    jit = [basic.add_kernel, basic.increment_kernel.fn]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    old_gc = gc.get_threshold()
    gc.set_threshold(50)
    errors: list[BaseException] = []
    stop = time.monotonic() + 4.0

    def parse(fn):
        while time.monotonic() < stop and not errors:
            try:
                fn.parse()
            except SystemError as exc:
                errors.append(exc)

    def garbage():
        while time.monotonic() < stop and not errors:
            _Cycle()

    threads = [threading.Thread(target=parse, args=(jit[i % 2],)) for i in range(4)]
    threads.append(threading.Thread(target=garbage))
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
        gc.set_threshold(*old_gc)
    assert not errors, errors[0]


# -- first calls against the fake driver: broken files, kills, short memory --------------------

FIRST_CALL = """
import sys, json, os, logging
sys.path.insert(0, {tests!r})
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s: %(message)s")
import triton, lazytriton
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DeviceArray
from kernels import basic
k = lazytriton.kernel(basic.increment_kernel)
n = 1 << 20
x = DeviceArray(0x7F0000000000, "fp32", 4 * n, (n,))
go = os.environ.get("GO_FILE")
if go:
    open(go + ".ready." + str(os.getpid()), "w").close()
    while not os.path.exists(go):
        pass
grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)
k[grid](x, n)
k[grid](x, n)
if os.environ.get("EXIT_AT_ONCE") != "1":
    stubgen.wait_for_builds()
s = lazytriton.stats()
print(json.dumps({{"tunes": s["tunes"], "record_hits": s["record_hits"]}}))
"""


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("triton-cache")  # shared: each process compiles from Triton's cache


def fake_env(fake_driver, cache: Path, triton_cache: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYTRITON_")}
    env.update(LD_LIBRARY_PATH=str(fake_driver), TRITON_LIBCUDA_PATH=str(fake_driver),
               FAKE_CUDA_LOG=str(triton_cache / "launches.jsonl"), FAKE_CUDA_PARAM_SIZES="increment_kernel:8,4,8,8",
               LAZYTRITON_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(triton_cache),
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"),
               LAZYTRITON_COMPILE_WORKERS="0", **extra)
    return env


def first_call(env: dict, script: str = FIRST_CALL, check: bool = True) -> tuple[dict | None, str, int]:
    r = subprocess.run([sys.executable, "-c", script.format(tests=str(HERE))], env=env, capture_output=True,
                       text=True, timeout=600, cwd=env["TRITON_CACHE_DIR"])
    if check:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    return out, r.stderr, r.returncode


def stubs(cache: Path) -> list[Path]:
    return sorted((cache / "stubs").glob(f"*/lt_stub_*{EXT}"))


def temps(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*") if ".tmp" in p.name)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_checksum"])
def test_a_broken_launch_stub_is_discarded_once_naming_the_kernel_and_rebuilt(fake_driver, triton_cache, tmp_path,
                                                                             damage):
    cache = tmp_path / "cache"
    env = fake_env(fake_driver, cache, triton_cache, LAZYTRITON_STUB_BUILD="sync")
    assert first_call(env)[0]["tunes"] == 1
    [so] = stubs(cache)
    good = so.read_bytes()
    for sync in ("sync", "background"):  # rebuilt by the caller, or on the background thread
        if damage == "truncate":
            so.write_bytes(good[:len(good) // 3])
        elif damage == "garbage":
            so.write_bytes(os.urandom(len(good)))
        else:  # a file that was never published by a finished build
            for f in so.parent.glob("*.sha256"):
                f.unlink()
        out, err, _ = first_call(fake_env(fake_driver, cache, triton_cache, LAZYTRITON_STUB_BUILD=sync))
        assert out == {"tunes": 0, "record_hits": 1}
        warned = [line for line in err.splitlines() if "discarding" in line]
        assert len(warned) == 1, err[-3000:]
        assert "kernel increment_kernel" in warned[0] and so.name in warned[0], warned
        assert stubs(cache) == [so]
        out, err, _ = first_call(fake_env(fake_driver, cache, triton_cache, LAZYTRITON_STUB_BUILD=sync))
        assert "discarding" not in err, err[-3000:]
    assert stubs(cache) == [so] and so.stat().st_size == len(good)


def test_a_process_that_ends_right_after_its_first_call_leaves_no_temp_file(fake_driver, triton_cache, tmp_path):
    cache = tmp_path / "cache"
    tmpdir = tmp_path / "tmpdir"  # the compiler's temp files (cc*.s, cc*.o) would be left here
    tmpdir.mkdir()
    env = fake_env(fake_driver, cache, triton_cache, EXIT_AT_ONCE="1", TMPDIR=str(tmpdir))  # still building at exit
    for _ in range(2):
        first_call(env)
        time.sleep(0.5)  # a compiler left running would write its output now
        assert temps(cache) == [], temps(cache)
        assert [p.name for p in tmpdir.iterdir() if p.name.startswith("cc")] == []
    # Temp files of a killed build (no exit handler ran) are swept by the next build of that stub.
    first_call(fake_env(fake_driver, cache, triton_cache))
    [so] = stubs(cache)
    so.unlink()
    dead = [so.parent / f".{so.name}.99999.deadbeef.tmp", so.parent / "tmpabcdefgh.so.tmp"]
    for d in dead:
        d.write_bytes(b"half a build")
    os.utime(dead[1], (time.time() - 7200, time.time() - 7200))
    first_call(fake_env(fake_driver, cache, triton_cache, LAZYTRITON_STUB_BUILD="sync"))
    assert temps(cache) == [] and stubs(cache) == [so]


def test_cache_clear_removes_launch_stubs_too(fake_driver, triton_cache, tmp_path, capsys):
    cache = tmp_path / "cache"
    first_call(fake_env(fake_driver, cache, triton_cache, LAZYTRITON_STUB_BUILD="sync"))
    assert len(stubs(cache)) == 1
    assert cli.main(["cache", "--cache-dir", str(cache), "clear"]) == 0
    assert "and 1 launch stub" in capsys.readouterr().out
    assert stubs(cache) == []


# (A file there is refused when lazytriton is imported: tests/test_newcomer.py.)
@pytest.mark.parametrize("how", ["cannot_be_made", "read_only"])
def test_a_cache_dir_that_cannot_be_written_is_said_once_and_the_call_works(fake_driver, triton_cache, tmp_path, how):
    cache = tmp_path / "cache"
    if how == "cannot_be_made":
        cache = Path("/proc/lazytriton-test-cache")  # not even root can make it
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes to read-only directories")
        cache.mkdir()
        cache.chmod(0o555)
    out, err, _ = first_call(fake_env(fake_driver, cache, triton_cache, LAZYTRITON_STUB_BUILD="sync"))
    assert out == {"tunes": 1, "record_hits": 0}
    stub_warnings = [line for line in err.splitlines() if "cannot write launch stubs" in line]
    assert len(stub_warnings) == 1 and f"LAZYTRITON_CACHE_DIR to a writable directory; it is {cache})" in \
        stub_warnings[0], err[-3000:]


BUNDLE_ADD = """
import sys, json, logging
sys.path.insert(0, {tests!r})
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s: %(message)s")
import triton, lazytriton
from lazytriton.model.arrays import DeviceArray
from lazytriton.cpp.bundle import Bundle
from kernels import basic
n = 1 << 20
x = DeviceArray(0x7F0000000000, "fp32", 4 * n, (n,))
b = Bundle(sys.argv[1] if len(sys.argv) > 1 else "bundle")
b.add(basic.increment_kernel, x, n, grid=lambda m: (triton.cdiv(n, m["BLOCK"]),))
print(json.dumps({{"variants": len(b.variants())}}))
"""


BUNDLE_READER_CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(bundle_increment LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(lazytriton CONFIG REQUIRED)
add_executable(bundle_increment bundle_increment.cc)
target_link_libraries(bundle_increment PRIVATE lazytriton::runtime)
"""


@pytest.fixture(scope="module")
def bundle_reader(tmp_path_factory):
    """fake_cuda/bundle_increment.cc (a C++ program launching from a bundle), or None without cmake."""
    import shutil

    from test_embed import CMAKE, cmake_build

    if CMAKE is None:
        return None
    src = tmp_path_factory.mktemp("bundle-increment")
    shutil.copy(HERE / "fake_cuda" / "bundle_increment.cc", src / "bundle_increment.cc")
    (src / "CMakeLists.txt").write_text(BUNDLE_READER_CMAKE)
    cmake_build(src, src / "build")
    return src / "build" / "bundle_increment"


def read_bundle(exe: Path | None, bundle: Path, env: dict) -> str:
    if exe is None:
        return ""
    return subprocess.run([str(exe), str(bundle)], env=env, capture_output=True, text=True, timeout=120).stdout


def test_fault_injection_every_file_the_runtime_writes(fake_driver, triton_cache, tmp_path, capsys, bundle_reader):
    """Each kind of file the runtime writes, cut short or overwritten: the next
    call works and says once what it discarded."""
    cache = tmp_path / "cache"
    env = fake_env(fake_driver, cache, triton_cache, LAZYTRITON_STUB_BUILD="sync")
    assert first_call(env)[0] == {"tunes": 1, "record_hits": 0}

    # Tuning record, binaries and the configs' measured times: discarded one by one, re-tuned.
    records = sorted((cache / "v1" / "records").glob("*"))
    binaries = sorted((cache / "v1" / "binaries").glob("*"))
    measured = sorted((cache / "v1" / "measurements").glob("*"))
    assert records and binaries and measured
    records[0].write_bytes(records[0].read_bytes()[:40])
    for b in binaries:
        b.write_bytes(os.urandom(b.stat().st_size))
    measured[0].write_bytes(measured[0].read_bytes()[:-3])
    out, err, _ = first_call(env)
    assert out["tunes"] == 1
    discarded = [line for line in err.splitlines() if "discarding invalid cache entry" in line]
    assert sum(records[0].name in d for d in discarded) == 1, err[-3000:]
    assert all(sum(b.name in d for d in discarded) <= 1 for b in binaries), discarded
    assert sum(measured[0].name in line for line in err.splitlines() if "discarding the invalid measurements" in line) == 1
    # The record alone: rebuilt from the configs' times measured then, no trial; the winner compiled alone.
    [record] = sorted((cache / "v1" / "records").glob("*"))
    record.write_bytes(b"junk")
    out, err, _ = first_call(env)
    assert out == {"tunes": 0, "record_hits": 0} and err.count("discarding") == 1, err[-3000:]
    assert first_call(env)[0] == {"tunes": 0, "record_hits": 1}  # healed: no warnings, no tuning

    # Launch stub.
    [so] = stubs(cache)
    so.write_bytes(so.read_bytes()[:100])
    out, err, _ = first_call(env)
    assert out == {"tunes": 0, "record_hits": 1} and err.count("discarding") == 1, err[-3000:]

    # C++ bundle manifest and a cubin of it.
    bundle = tmp_path / "bundle"
    r = subprocess.run([sys.executable, "-c", BUNDLE_ADD.format(tests=str(HERE)), str(bundle)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))  # not the checkout's source
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_bundle(bundle_reader, bundle, env).strip() == ("launched" if bundle_reader else "")
    [cubin] = (bundle / "cubins").glob("*.cubin")
    cubin.write_bytes(cubin.read_bytes()[:64])
    if bundle_reader is not None:  # the C++ reader names what is broken: it cannot rebuild
        out = read_bundle(bundle_reader, bundle, env)
        assert "increment_kernel" in out and f"{cubin.name} is 64 bytes, the manifest says" in out, out
    manifest = bundle / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:len(manifest.read_bytes()) // 2])
    if bundle_reader is not None:
        assert "manifest.json" in read_bundle(bundle_reader, bundle, env)
    assert cli.main(["bundle", str(bundle)]) == 1  # listing a broken bundle names it
    assert "not a readable bundle manifest" in capsys.readouterr().err
    r = subprocess.run([sys.executable, "-c", BUNDLE_ADD.format(tests=str(HERE)), str(bundle)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))  # not the checkout's source
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"variants": 1}
    assert r.stderr.count("discarding its unreadable manifest") == 1, r.stderr[-3000:]
    assert r.stderr.count("replacing cubins/") == 1, r.stderr[-3000:]
    assert cli.main(["bundle", str(bundle)]) == 0
    assert read_bundle(bundle_reader, bundle, env).strip() == ("launched" if bundle_reader else "")

    # Exported archive: refused whole with its name, nothing installed; the cache still serves.
    archive = tmp_path / "kernels.tar.gz"
    assert cli.main(["cache", "export", str(archive), "--cache-dir", str(cache)]) == 0
    capsys.readouterr()
    data = archive.read_bytes()
    other = tmp_path / "other"
    for broken in (data[:len(data) // 2], data[:300], os.urandom(len(data))):
        archive.write_bytes(broken)
        assert cli.main(["cache", "import", str(archive), "--cache-dir", str(other)]) == 1
        err = capsys.readouterr().err
        assert f"error: {archive}: not a readable lazytriton archive" in err, err
        assert not list(other.rglob("*.lt?"))
    assert first_call(env)[0] == {"tunes": 0, "record_hits": 1}


def test_tuning_without_memory_for_the_l2_flush_degrades_and_says_so_once(fake_driver, triton_cache, tmp_path):
    cache = tmp_path / "cache"
    # 1 MiB left on the device: no L2-flush buffer (>= the fake's 50 MiB L2), snapshots on the host.
    env = fake_env(fake_driver, cache, triton_cache, LAZYTRITON_FLUSH_L2="1", FAKE_CUDA_MAX_ALLOC=str(1 << 20))
    out, err, _ = first_call(env)
    assert out == {"tunes": 1, "record_hits": 0}, err[-3000:]
    assert err.count("no device memory for the tuner's L2-flush buffer") == 1, err[-3000:]
    # 60 MiB left: not twice the L2, but the L2's size: the flush goes on, smaller, and nothing is said.
    env.update(LAZYTRITON_RETUNE="1", FAKE_CUDA_MAX_ALLOC=str(60 << 20))
    out, err, _ = first_call(env)
    assert out["tunes"] == 1 and "L2" not in err, err[-3000:]


def test_eight_processes_on_a_fresh_cache_tune_once(fake_driver, triton_cache, tmp_path):
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    env = fake_env(fake_driver, cache, triton_cache, GO_FILE=str(go))
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_CALL.format(tests=str(HERE))], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path)) for _ in range(8)]
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("go.ready.*"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()  # all eight make their first call at once
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)  # a deadlock fails here
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(o["tunes"] for o in outs) == 1 and sum(o["record_hits"] for o in outs) == 7, outs
    assert temps(cache) == []


KILLED = """
import logging, os, signal, sys
class Kill(logging.Handler):
    def emit(self, record):
        if {when!r} in record.getMessage():
            os.kill(os.getpid(), signal.SIGKILL)
logging.getLogger("lazytriton").addHandler(Kill())
logging.getLogger("lazytriton").setLevel(logging.INFO)
"""


@pytest.mark.parametrize("when", ["compiling", "tuning on the call's buffers", "saving x", "building kernel increment_kernel: launch stub"])
def test_a_process_killed_mid_first_call_leaves_nothing_a_later_process_trusts(fake_driver, triton_cache, tmp_path,
                                                                              when):
    cache = tmp_path / "cache"
    env = fake_env(fake_driver, cache, triton_cache, LAZYTRITON_STUB_BUILD="sync")
    killed = KILLED.format(when=when) + FIRST_CALL
    for _ in range(2):
        _, _, rc = first_call(env, killed, check=False)
        assert rc == -signal.SIGKILL, f"never reached {when!r}"
    out, err, _ = first_call(env)
    assert out == {"tunes": 1, "record_hits": 0}, out
    assert "discarding" not in err, err[-3000:]
    assert len(stubs(cache)) == 1
    assert first_call(env)[0] == {"tunes": 0, "record_hits": 1}
