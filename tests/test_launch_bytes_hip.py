"""AMD GPUs, checked without one: the bytes lazytriton hands the HIP runtime are
the bytes Triton's own HIP launcher hands it. A stand-in libamdhip64.so
(fake_hip/fake_hip.c: one gfx942 wave64 device) records every launch (the HIP
call, grid, block, shared memory, stream, launch attributes, each parameter's
bytes as the code object's argument table sizes them), and
fake_hip/launch_probe.py launches the same HSACO kernels through lazytriton
(LAZYTRITON_DRIVER=hip: the one launch core over its HIP driver layer; first
call and tuning trials, the generated stub, the table-driven stub, a persisted
winner in a new kernel object, lazytriton.jax call sites lowered for ROCm and
launched by the XLA handler's C++) and through the installed Triton's
HIPLauncher and driver.c, built against the same stand-in. Nothing here ran on
AMD hardware."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton

HERE = Path(__file__).resolve().parent
AMD = Path(triton.__file__).parent / "backends" / "amd"
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = [pytest.mark.skipif(CC is None, reason="needs a C compiler"),
              pytest.mark.skipif(not (AMD / "driver.py").exists(), reason="this Triton has no AMD backend")]


@pytest.fixture(scope="module")
def fake_hip(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake-hip")
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(d / "libamdhip64.so"), str(HERE / "fake_hip" / "fake_hip.c")],
                   check=True)
    return d


def hip_env(fake: Path, tmp_path: Path, **extra) -> dict:
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake), TRITON_LIBHIP_PATH=str(fake / "libamdhip64.so"),
               LAZYTRITON_DRIVER="hip", FAKE_HIP_LOG=str(tmp_path / "launches.jsonl"),
               TRITON_CACHE_DIR=str(tmp_path / "triton"), LAZYTRITON_CACHE_DIR=str(tmp_path / "lazytriton"),
               LAZYTRITON_STUB_BUILD="sync", TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def probe(fake_hip, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe-hip")
    out = tmp / "probe.json"
    r = subprocess.run([sys.executable, str(HERE / "fake_hip" / "launch_probe.py"), str(out)],
                       env=hip_env(fake_hip, tmp), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return {c["case"]: c for c in json.loads(out.read_text())}


FIELDS = ("via", "grid", "block", "shared", "stream", "attrs", "params")


def same_launch(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in FIELDS)


def test_device_and_target_come_from_the_hip_runtime(probe):
    d = probe["device"]
    assert (d["backend"], d["arch"], d["warp_size"], d["name"]) == ("hip", "gfx942", 64, "FAKE MI300X")
    assert d["target"] == ["hip", "gfx942", 64]  # "gfx942:sramecc+:xnack-" as Triton's target names it


@pytest.mark.parametrize("name", ["axpy_flag", "axpy_flag_16", "mixed_scalars", "add_pair"])
def test_standalone_launches_are_tritons(probe, name):
    c = probe[name]
    (ref,) = c["triton"]
    assert c["arch"] == "gfx942" and c["warp_size"] == 64
    assert ref["via"] == "launch" and ref["block"] == [64 * c["num_warps"], 1, 1]  # wave64: 64 x num_warps
    assert len(ref["params"][-2:]) == 2  # global and profile scratch, appended as Triton's HIP launcher does
    # the first call, two calls through the generated stub, one through the table-driven stub
    assert len(c["lazytriton"]) == 4, c["lazytriton"]
    for got in c["lazytriton"]:
        assert same_launch(got, ref), (name, c["signature"], got, ref)


def test_tuning_trials_and_winner_are_tritons(probe):
    t = probe["autotuned"]
    refs = t["triton_per_config"]
    # AMD options in the configs reached the compile (and so the cache keys)
    assert [m["waves_per_eu"] for m in t["config_meta"]] == [0, 2, 0]
    assert [m["matrix_instr_nonkdim"] for m in t["config_meta"]] == [0, 0, 16]
    assert len({(r["block"][0], r["grid"][0]) for r in refs}) == 3
    trials = t["lazytriton"][:-4]
    assert len(trials) >= 3
    for got in trials:
        assert any(same_launch(got, r) for r in refs), got
    assert all(any(same_launch(got, r) for got in trials) for r in refs)  # every config was timed
    for got in t["lazytriton"][-4:] + t["persisted"]:  # the winner's launches, then from the cache
        assert same_launch(got, refs[t["winner"]])
    assert len(t["persisted"]) == 1


@pytest.mark.parametrize("name", ["jax_axpy_flag", "jax_add_pair"])
def test_jax_handler_launches_are_tritons(probe, name):
    pytest.importorskip("jax")
    c = probe[name]
    (ref,) = c["triton"]
    assert len(c["lazytriton"]) == 2
    for got in c["lazytriton"]:
        assert same_launch(got, ref), (name, got, ref)


CHECK_FITS = r"""
import lazytriton
from lazytriton import _core
from lazytriton.compiler import Binder, compile_one, target_for
from lazytriton.spec import describe
from lazytriton.arrays import PointerArg
import triton, triton.language as tl

@triton.jit
def k(x, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), 1.0)

spec = describe(k)
for arch in ("gfx90a", "sm_90"):
    t = target_for(arch)
    b = compile_one(spec, t, Binder(spec, t).bind((), {"x": PointerArg(0x7f0000000000, "fp32"), "BLOCK": 64}))
    try:
        _core.Kernel(b.cubin, b.metadata).launch((1, 1, 1), 0, ["*fp32"], [0x7f0000000000])
        print(arch, "launched")
    except Exception as e:
        print(arch, type(e).__name__, e)
"""


def test_a_binary_for_another_target_is_refused(fake_hip, tmp_path):
    """On the (fake) gfx942: an HSACO for gfx90a and a cubin for sm_90 are refused by
    name before anything is loaded or launched."""
    env = hip_env(fake_hip, tmp_path, FAKE_HIP_PARAM_SIZES="k:8,8,8")
    (tmp_path / "check_fits.py").write_text(CHECK_FITS)
    r = subprocess.run([sys.executable, str(tmp_path / "check_fits.py")], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert "gfx90a RuntimeFailure kernel k was compiled for gfx90a but FAKE MI300X is gfx942" in lines, lines
    assert any(ln.startswith("sm_90 RuntimeFailure kernel k was compiled for NVIDIA sm_90 but FAKE MI300X is an AMD "
                             "GPU (gfx942)") for ln in lines), lines
    assert not (tmp_path / "launches.jsonl").exists()
