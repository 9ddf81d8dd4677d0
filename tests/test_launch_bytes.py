"""The bytes lazytriton hands cuLaunchKernelEx are the bytes Triton's own
launcher hands it, checked without a GPU: a stand-in libcuda.so.1
(fake_cuda/fake_cuda.c) records every launch's parameters and writes
cuTensorMapEncodeTiled's arguments into the tensor map, and
fake_cuda/launch_probe.py launches the same compiled kernels through
lazytriton (resolution, tuning trials, the generated stub, the table-driven
stub) and through the installed Triton's driver.py launcher, built against
the same stand-in. Host TMA descriptors (lowered to TMA on sm_90, decomposed
on sm_80: the parameter layout of the installed Triton, 3.5/3.6 or 3.7+),
descriptors inside tuples, tuples of pointers and scalars, an autotuned
kernel whose configs' pre_hooks set the block shapes, lazytriton.jax call
sites (lowered for CUDA here, resolved as the XLA handler resolves them, and
launched by the handler's C++ from buffer addresses), Gluon kernels
(kernels/gluonk.py: plain, autotuned, a 2D layout with a float scalar, a
device-side TMA copy with global scratch; standalone and through
lazytriton.jax), and C++ bundles
(fake_cuda/bundle_launch.cc: lt::TensorDesc and tuple elements, AOT)."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton

HERE = Path(__file__).resolve().parent
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = [pytest.mark.skipif(CC is None, reason="needs a C compiler"),
              pytest.mark.skipif(not CUOBJDUMP.exists(), reason="no cuobjdump in Triton's wheel")]


BUNDLE_CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(bundle_launch LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(lazytriton CONFIG REQUIRED)
add_executable(bundle_launch bundle_launch.cc)
target_link_libraries(bundle_launch PRIVATE lazytriton::runtime)
"""


@pytest.fixture(scope="module")
def bundle_exe(tmp_path_factory):
    """fake_cuda/bundle_launch.cc built against the installed lazytriton (None without cmake)."""
    from test_embed import CMAKE, cmake_build

    if CMAKE is None:
        return None
    src = tmp_path_factory.mktemp("bundle-launch")
    shutil.copy(HERE / "fake_cuda" / "bundle_launch.cc", src / "bundle_launch.cc")
    (src / "CMakeLists.txt").write_text(BUNDLE_CMAKE)
    cmake_build(src, src / "build")
    return src / "build" / "bundle_launch"


def probe(fake: Path, tmp_path: Path, cc: int, bundle_exe: Path | None = None) -> list[dict]:
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake), TRITON_LIBCUDA_PATH=str(fake), FAKE_CUDA_CC=str(cc),
               FAKE_CUDA_LOG=str(tmp_path / "launches.jsonl"), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               LAZYTRITON_CACHE_DIR=str(tmp_path / "lazytriton"), LAZYTRITON_STUB_BUILD="sync",
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    if bundle_exe is not None:
        env["FAKE_CUDA_BUNDLE_EXE"] = str(bundle_exe)
    out = tmp_path / "probe.json"
    tmpdir = tmp_path / "tmpdir"  # the probe's $TMPDIR: it must leave nothing there (bundles, compilers' files)
    tmpdir.mkdir()
    env["TMPDIR"] = str(tmpdir)
    r = subprocess.run([sys.executable, str(HERE / "fake_cuda" / "launch_probe.py"), str(out)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    return json.loads(out.read_text())


def same_launch(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("grid", "block", "shared", "params"))


def same_launch_own_scratch(a: dict, b: dict) -> bool:
    """`a` (lazytriton's) is `b` (Triton's) but for the global scratch pointer (the
    second last parameter): Triton's from triton.set_allocator, lazytriton's own,
    which must then be there (not null) and aligned as the kernel asks (128 here)."""
    scratch = int.from_bytes(bytes.fromhex(a["params"][-2]), "little")
    return (all(a[k] == b[k] for k in ("grid", "block", "shared")) and a["params"][:-2] == b["params"][:-2]
            and a["params"][-1] == b["params"][-1] and scratch != 0 and scratch % 128 == 0)


@pytest.mark.heavy
@pytest.mark.parametrize("cc", [90, 80])
def test_launch_parameters_are_tritons(fake_driver, bundle_exe, tmp_path, cc):
    cases = {c["case"]: c for c in probe(fake_driver, tmp_path, cc, bundle_exe)}
    names = ["copy", "scale_store", "tuple_descs", "add_pair"]
    if importlib.util.find_spec("jax") is not None:
        names += ["jax_copy", "jax_add_pair", "jax_tuple_descs"]
    for name in names:
        c = cases[name]
        (ref,) = c["triton"]
        # standalone: the first call, two stub calls, one through the table-driven stub;
        # JAX: two launches of the handler's C++ (launch_fixed) from buffer addresses
        assert len(c["lazytriton"]) == (2 if name.startswith("jax") else 4), (name, c["lazytriton"])
        for got in c["lazytriton"]:
            assert same_launch(got, ref), (name, c["signature"], got, ref)
        if cc == 90 and "add_pair" not in name:  # a 128-byte CUtensorMap leads: encoded, not left empty
            maps = [p for p in ref["params"] if len(p) == 256]
            assert maps and all(bytes.fromhex(m)[1] in (2, 3) for m in maps), (name, maps)
    tuned = cases["autotuned"]
    refs = tuned["triton_per_config"]
    assert len(tuned["lazytriton"]) > 4  # tuning trials, then the winner's four launches
    for got in tuned["lazytriton"]:
        assert any(same_launch(got, r) for r in refs), got
    for got in tuned["lazytriton"][-4:] + tuned["persisted"]:  # the winner's launches, then from the cache
        assert same_launch(got, refs[tuned["winner"]])
    assert len(tuned["persisted"]) == 1
    if cc == 90:  # each config's own block shape (its pre_hook's) was encoded in its trials
        assert len({json.dumps(r["params"]) for r in refs}) == len(refs)
        assert all(any(same_launch(got, r) for got in tuned["lazytriton"]) for r in refs)
    check_gluon(cases, cc)
    if bundle_exe is not None:  # C++ bundles (AOT): lt::TensorDesc and tuple elements, as Triton launches them
        b = cases["bundle"]
        assert len(b["lazytriton"]) == len(b["triton"]) == 3
        for name, got, ref in zip(b["names"], b["lazytriton"], b["triton"]):
            assert same_launch(got, ref), (name, got, ref)


def check_gluon(cases: dict, cc: int):
    """Gluon kernels (kernels/gluonk.py), standalone and through lazytriton.jax, hand
    cuLaunchKernelEx Triton's bytes; the device-side TMA copy (sm_90, Triton 3.6+)
    all but its global scratch pointer, which lazytriton allocates itself."""
    from kernels import gluonk

    has_jax = importlib.util.find_spec("jax") is not None
    names = ["gluon_vec_add", "gluon_scale_rows"] + (["jax_gluon_vec_add", "jax_gluon_scale_rows"] if has_jax else [])
    tma_names = []
    if cc == 90 and gluonk.HAVE_DEVICE_TMA:
        tma_names = ["gluon_tma_copy"] + (["jax_gluon_tma_copy"] if has_jax else [])
    for name in names + tma_names:
        c = cases[name]
        (ref,) = c["triton"]
        assert len(c["lazytriton"]) == (2 if name.startswith("jax") else 4), (name, c["lazytriton"])
        assert not c.get("trials"), (name, c["trials"])  # one config: nothing to tune
        if name in tma_names:
            scratch = int.from_bytes(bytes.fromhex(ref["params"][-2]), "little")
            assert scratch != 0, ref  # the kernel does ask for global scratch
            for got in c["lazytriton"]:
                assert same_launch_own_scratch(got, ref), (name, got, ref)
        else:
            for got in c["lazytriton"]:
                assert same_launch(got, ref), (name, c.get("signature"), got, ref)
    assert len(cases["gluon_scale_rows"]["triton"][0]["params"]) == 8 + 2  # 3 pointers, 4 ints, the float
    # Autotuned: each trial is Triton's launch of one config (its block, grid and warps), the
    # launches after it the winner's.
    tuned = [cases["gluon_tuned"]] + ([cases["jax_gluon_tuned"]] if has_jax else [])
    for t in tuned:
        refs = t.get("triton_per_config") or t["triton"]
        assert len(refs) == 3 and len({(r["block"], tuple(r["grid"])) for r in refs}) == 3, refs
        trials = t.get("trials", t["lazytriton"][:-4])
        assert len(trials) >= 3, t  # every config was timed
        for got in trials:
            assert any(same_launch(got, r) for r in refs), got
        winners = t["lazytriton"][-4:] if "triton_per_config" in t else t["lazytriton"]
        assert winners and all(same_launch(got, refs[t["winner"]]) for got in winners), (winners, refs[t["winner"]])
