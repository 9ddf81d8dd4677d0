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
HIPLauncher and driver.c, built against the same stand-in: the installed
Triton's, and 3.5's, 3.6's and the newest's where tests/triton_versions/setup_venvs.sh
made their venvs ($LAZYTRITON_TRITON_VENVS). Nothing here ran on AMD hardware."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton
from test_triton_versions import VERSIONS

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


VENVS = Path(os.environ.get("LAZYTRITON_TRITON_VENVS", "~/.cache/lazytriton-triton-venvs")).expanduser()


def interpreter(version: str) -> str:
    """This process's Python ("installed"), or that of the venv of a Triton version made by
    tests/triton_versions/setup_venvs.sh (skipped when absent, failed when stale)."""
    if version == "installed":
        return sys.executable
    venv = VENVS / f"triton-{version}"
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no venv for triton {version} at {venv}: run tests/triton_versions/setup_venvs.sh")
    spec = importlib.util.spec_from_file_location("lt_hip_stamp", HERE / "triton_versions" / "stamp.py")
    stamp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stamp)
    made_from = (venv / "lazytriton-sources.sha256").read_text().strip() if (venv / "lazytriton-sources.sha256").exists() else None
    if made_from != stamp.source_digest(HERE.parent):
        pytest.fail(f"{venv} holds a lazytriton built from other sources than this checkout's: run "
                    f"tests/triton_versions/setup_venvs.sh {version}")
    return str(venv / "bin" / "python")


# The stand-in device: an MI300X (gfx942, wave64), and on the installed Triton also an RDNA3
# gfx1100 (wave32: a block is 32 x num_warps there).
@pytest.fixture(scope="module", params=["installed", "installed-gfx1100", *VERSIONS])
def probe(request, fake_hip, tmp_path_factory):
    version, _, arch = request.param.partition("-")
    python = interpreter(version)
    tmp = tmp_path_factory.mktemp("probe-hip")
    out = tmp / "probe.json"
    # Triton 3.6's AMD specializer imports torch for its buffer-ops attribute ("within 2 GB"), which
    # the venvs lack: off there (lazytriton's arrays never get that attribute, see README).
    # The installed Triton's run also writes its axpy_flag and add_pair winners into a bundle.
    extra = {"FAKE_HIP_BUNDLE_DIR": str(tmp / "bundle")} if request.param == "installed" else {}
    if version != "installed":
        extra["AMDGCN_USE_BUFFER_OPS"] = "0"
    if arch:
        extra.update(FAKE_HIP_ARCH=arch, FAKE_HIP_WARP="32")
    env = hip_env(fake_hip, tmp, **extra)
    if version != "installed":
        env.pop("PYTHONPATH", None)
    r = subprocess.run([python, str(HERE / "fake_hip" / "launch_probe.py"), str(out)], env=env, cwd=str(tmp),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    cases = {c["case"]: c for c in json.loads(out.read_text())}
    cases["version"] = request.param
    if "param_sizes" in cases:
        cases["bundle_dir"] = tmp / "bundle"
    return cases


FIELDS = ("via", "grid", "block", "shared", "stream", "attrs", "params")


def same_launch(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in FIELDS)


def test_device_and_target_come_from_the_hip_runtime(probe):
    d = probe["device"]
    want = ("gfx1100", 32) if probe["version"].endswith("gfx1100") else ("gfx942", 64)
    assert (d["backend"], d["arch"], d["warp_size"], d["name"]) == ("hip", *want, "FAKE MI300X")
    assert d["target"] == ["hip", *want]  # "gfx942:sramecc+:xnack-" as Triton's target names it


@pytest.mark.parametrize("name", ["axpy_flag", "axpy_flag_16", "mixed_scalars", "add_pair", "cooperative", "descriptors"])
def test_standalone_launches_are_tritons(probe, name):
    c = probe[name]
    (ref,) = c["triton"]
    d = probe["device"]
    assert c["arch"] == d["arch"] and c["warp_size"] == d["warp_size"]
    assert ref["via"] == ("cooperative" if name == "cooperative" else "launch")  # which HIP launch call
    assert ref["block"] == [d["warp_size"] * c["num_warps"], 1, 1]  # wave64 (wave32): 64 (32) x num_warps
    if name == "axpy_flag_16":
        assert c["waves_per_eu"] == 2  # given with the call, compiled in
    if name == "descriptors":  # two decomposed descriptors (base, 2 shapes, 2 strides, padding) and alpha
        assert len(ref["params"]) > 2 * 6 + 1 + 2, ref["params"]
    assert len(ref["params"][-2:]) == 2  # global and profile scratch, appended as Triton's HIP launcher does
    # the first call, two calls through the generated stub, one through the table-driven stub
    assert len(c["lazytriton"]) == 4, c["lazytriton"]
    for got in c["lazytriton"]:
        assert same_launch(got, ref), (name, c["signature"], got, ref)


def test_tuning_trials_and_winner_are_tritons(probe):
    t = probe["autotuned"]
    refs = t["triton_per_config"]
    # AMD options in the configs reached the compile (and so the cache keys)
    waves = [m["waves_per_eu"] for m in t["config_meta"]]
    assert waves[1] == 2 and waves[0] == waves[2] != 2  # the default: 0 (3.5: 1)
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
    if name not in probe:
        pytest.skip("no jax where the probe ran")
    c = probe[name]
    (ref,) = c["triton"]
    assert len(c["lazytriton"]) == 2
    for got in c["lazytriton"]:
        assert same_launch(got, ref), (name, got, ref)


CHECK_FITS = r"""
import lazytriton
from lazytriton import _core
from lazytriton.compile.compiler import Binder, compile_one
from lazytriton.compile.targets import target_for
from lazytriton.model.spec import kernel_spec
from lazytriton.model.arrays import PointerArg
import triton, triton.language as tl

@triton.jit
def k(x, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), 1.0)

spec = kernel_spec(k)
for arch in ("gfx90a", "sm_90"):
    t = target_for(arch)
    b = compile_one(spec, t, Binder(spec, t).bind((), {"x": PointerArg(0x7f0000000000, "fp32"), "BLOCK": 64}))
    try:
        entry = _core.Entry(_core.Kernel(b.cubin, b.metadata), [True, False], None, (1, 1, 1), [(0, 0)])
        _core.launch_fixed(entry, 0, [0x7f0000000000])
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


@pytest.fixture(scope="module")
def bundle_exe(tmp_path_factory):
    """fake_hip/bundle_launch.cc built against the installed lazytriton."""
    from test_embed import CMAKE, cmake_build
    from test_launch_bytes import BUNDLE_CMAKE

    if CMAKE is None:
        pytest.skip("no cmake")
    src = tmp_path_factory.mktemp("bundle-launch-hip")
    shutil.copy(HERE / "fake_hip" / "bundle_launch.cc", src / "bundle_launch.cc")
    (src / "CMakeLists.txt").write_text(BUNDLE_CMAKE)
    cmake_build(src, src / "build")
    return src / "build" / "bundle_launch"


def run_bundle(exe: Path, bundle_dir: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), str(bundle_dir)], env=env, capture_output=True, text=True, timeout=300)


def test_bundle_launches_are_tritons(probe, bundle_exe, fake_hip, tmp_path):
    """A C++ bundle of gfx942 winners launches through the same HIP layer with Triton's bytes."""
    if probe["version"] != "installed":
        pytest.skip("bundles are written by the installed lazytriton's run")
    env = hip_env(fake_hip, tmp_path, FAKE_HIP_PARAM_SIZES=probe["param_sizes"]["env"])
    r = run_bundle(bundle_exe, probe["bundle_dir"], env)
    assert r.returncode == 0 and "launched" in r.stdout, r.stdout + r.stderr
    got = [json.loads(line) for line in (tmp_path / "launches.jsonl").read_text().splitlines()]
    refs = [probe["axpy_flag"]["triton"][0], probe["add_pair"]["triton"][0]]
    assert len(got) == 2
    for g, ref in zip(got, refs):
        assert same_launch(g, ref), (g, ref)
    manifest = json.loads((probe["bundle_dir"] / "manifest.json").read_text())
    archs = {v["arch"] for k in manifest["kernels"].values() for v in k["variants"]}
    assert archs == {"gfx942"}  # the bundle carries the AMD target by name


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake-cuda-for-hip")
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(d / "libcuda.so.1"), str(HERE / "fake_cuda" / "fake_cuda.c")],
                   check=True)
    return d


def cuda_env(fake_cuda: Path, tmp_path: Path, **extra) -> dict:
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_cuda), LAZYTRITON_DRIVER="cuda",
               FAKE_CUDA_LOG=str(tmp_path / "cuda-launches.jsonl"), LAZYTRITON_CACHE_DIR=str(tmp_path / "lt-cuda"),
               TRITON_CACHE_DIR=str(tmp_path / "triton-cuda"), LAZYTRITON_STUB_BUILD="sync",
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    env.update(extra)
    return env


SM90_BUNDLE = r"""
import sys
sys.path.insert(0, sys.argv[2])
from kernels.hip_kernels import axpy_flag
from lazytriton.cpp import bundle
from lazytriton.model.arrays import DeviceArray
base = 0x7F0000000000
x, y, z = (DeviceArray(base + i * 2**22, "fp32", 4000, (1000,)) for i in range(3))
bundle.Bundle(sys.argv[1]).add(axpy_flag, x, y, z, 1000, -0.75, True, BLOCK=256, grid=(4, 1, 1), stream=0,
                              source="kernels.hip_kernels:axpy_flag")
print("written")
"""


def test_bundle_refuses_the_other_vendors_device(probe, bundle_exe, fake_hip, fake_cuda, tmp_path):
    """A gfx942 bundle on an sm_90 device, and an sm_90 bundle on a gfx942 device: refused,
    naming both targets, before anything is loaded or launched."""
    if probe["version"] != "installed":
        pytest.skip("bundles are written by the installed lazytriton's run")
    r = run_bundle(bundle_exe, probe["bundle_dir"], cuda_env(fake_cuda, tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "holds this kernel only for AMD GPUs (gfx942); this device, FAKE sm_90, is an NVIDIA sm_90" in r.stdout, r.stdout
    assert not (tmp_path / "cuda-launches.jsonl").exists()
    # the reverse: winners tuned on the (fake) sm_90, launched on the (fake) gfx942
    sm90 = tmp_path / "sm90-bundle"
    (tmp_path / "sm90_bundle.py").write_text(SM90_BUNDLE)
    env = cuda_env(fake_cuda, tmp_path, FAKE_CUDA_PARAM_SIZES="axpy_flag:8,8,8,4,4,1,8,8")
    w = subprocess.run([sys.executable, str(tmp_path / "sm90_bundle.py"), str(sm90), str(HERE)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert w.returncode == 0 and "written" in w.stdout, w.stdout + w.stderr[-3000:]
    r = run_bundle(bundle_exe, sm90, hip_env(fake_hip, tmp_path, FAKE_HIP_PARAM_SIZES="axpy_flag:8,8,8,4,4,1,8,8"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("holds this kernel only for NVIDIA GPUs (sm_90); this device, FAKE MI300X, is an AMD gfx942" in r.stdout), r.stdout
    assert not (tmp_path / "launches.jsonl").exists()


NO_TORCH = r"""
import sys
sys.path.insert(0, sys.argv[1])
import lazytriton
from kernels.hip_kernels import axpy_flag
from lazytriton.model.arrays import DeviceArray
x, y, z = (DeviceArray(0x7F0000000000 + i * 2**22, "fp32", 4000, (1000,)) for i in range(3))
try:
    lazytriton.kernel(axpy_flag)[(4,)](x, y, z, 1000, 1.0, True, BLOCK=256, stream=0)
except RuntimeError as e:
    print("refused:", e)
"""


def test_triton_36_amd_specializer_without_torch_says_what_to_do(fake_hip, tmp_path):
    """Triton 3.6 imports torch to specialize AMD pointers (its venv has none; 3.5 does not
    get there for lazytriton's arrays): a clear error naming the kernel and the way out,
    not a bare ModuleNotFoundError."""
    python = interpreter("3.6")
    (tmp_path / "no_torch.py").write_text(NO_TORCH)
    env = hip_env(fake_hip, tmp_path)
    env.pop("PYTHONPATH", None)
    env.pop("AMDGCN_USE_BUFFER_OPS", None)
    r = subprocess.run([python, str(tmp_path / "no_torch.py"), str(HERE)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("refused: kernel axpy_flag: Triton 3." in r.stdout and "install torch, or set AMDGCN_USE_BUFFER_OPS=0"
            in r.stdout), r.stdout + r.stderr[-2000:]
