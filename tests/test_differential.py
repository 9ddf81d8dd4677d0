"""Differential test against Triton's own binder and launcher, on the CPU
(tests/fake_cuda/differential.py in a process whose libcuda.so.1 is the
recording stand-in): seeded random sequences of calls on one kernel object
per kernel and face, each call's launch compared with what Triton's
unmodified JITFunction.run hands the driver for it (image, grid, block, shared
memory, launch attributes, parameter bytes). The calls pass, now and then,
keywords beside the arguments (launch options, values a triton.heuristics
sets, a meta-parameter an autotune config sets): lazytriton must take and
refuse the calls Triton's own kernel[grid](...) takes and refuses.

- on the installed Triton: the table-driven stub, the generated stubs, the
  lazytriton.jax call site and C++ bundles (fake_cuda/bundle_calls.cc);
- on Triton 3.5 to 3.8 and the newest, in the venvs tests/triton_versions/
  setup_venvs.sh made (skipped when absent; CI makes 3.5 to 3.8).

Longer runs: LAZYTRITON_DIFFERENTIAL_CALLS (calls per kernel and face, default
300) and LAZYTRITON_DIFFERENTIAL_SEED (default 0), or the script itself:
    python tests/fake_cuda/differential.py out.json --calls 5000 --seed 7
(under the stand-in driver: see `_env` below).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_triton_versions import VERSIONS

HERE = Path(__file__).resolve().parent
PROBE = HERE / "fake_cuda" / "differential.py"
CC = shutil.which("cc") or shutil.which("gcc")
CALLS = int(os.environ.get("LAZYTRITON_DIFFERENTIAL_CALLS", "300"))
SEED = int(os.environ.get("LAZYTRITON_DIFFERENTIAL_SEED", "0"))
KERNELS = {"optional_inputs", "int_kinds", "tuned_heuristics", "heuristic_on_int", "heuristic_over_tuned",
           "tuple_args", "desc_scale", "option_params_tuned", "option_params",
           "option_params_heuristic"}
JAX_KERNELS = {"optional_inputs", "int_kinds", "tuned_heuristics", "heuristic_on_int", "heuristic_over_tuned"}
AUTOTUNED = {"tuned_heuristics", "heuristic_over_tuned"}

pytestmark = pytest.mark.skipif(CC is None, reason="needs a C compiler (the stand-in libcuda.so.1)")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    d = tmp_path_factory.mktemp("fake-cuda")
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(d / "libcuda.so.1"),
                    str(HERE / "fake_cuda" / "fake_cuda.c")], check=True)
    (d / "libcuda.so").symlink_to("libcuda.so.1")  # Triton 3.5/3.6 link their C helpers with -lcuda
    return d


BUNDLE_CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(bundle_calls LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(lazytriton CONFIG REQUIRED)
add_executable(bundle_calls bundle_calls.cc)
target_link_libraries(bundle_calls PRIVATE lazytriton::runtime)
"""


@pytest.fixture(scope="module")
def bundle_calls_exe(tmp_path_factory):
    """fake_cuda/bundle_calls.cc built against the installed lazytriton (None without cmake)."""
    from test_embed import CMAKE, cmake_build

    if CMAKE is None:
        return None
    src = tmp_path_factory.mktemp("bundle-calls")
    shutil.copy(HERE / "fake_cuda" / "bundle_calls.cc", src / "bundle_calls.cc")
    (src / "CMakeLists.txt").write_text(BUNDLE_CMAKE)
    cmake_build(src, src / "build")
    return src / "build" / "bundle_calls"


def _env(fake: Path, tmp: Path) -> dict:
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake), TRITON_LIBCUDA_PATH=str(fake),
               FAKE_CUDA_LOG=str(tmp / "launches.jsonl"), TRITON_CACHE_DIR=str(tmp / "triton"),
               LAZYTRITON_CACHE_DIR=str(tmp / "lazytriton"),
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    env.pop("PYTHONPATH", None)
    return env


def run_probe(python: str, fake: Path, tmp: Path, faces: str, bundle_exe: Path | None = None,
              triton_cache: Path | None = None, kernels: set[str] | None = None) -> dict:
    out = tmp / "differential.json"
    env = _env(fake, tmp)
    if triton_cache is not None:
        env["TRITON_CACHE_DIR"] = str(triton_cache)
    if bundle_exe is not None:
        env["FAKE_CUDA_BUNDLE_CALLS_EXE"] = str(bundle_exe)
    tmpdir = tmp / "tmpdir"  # the probe's $TMPDIR: it must leave nothing there
    tmpdir.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmpdir)
    p = subprocess.run([python, str(PROBE), str(out), "--calls", str(CALLS), "--seed", str(SEED), "--faces", faces,
                        "--kernels", ",".join(sorted(kernels or ()))],
                       env=env, cwd=str(tmp), capture_output=True, text=True, timeout=1800)
    assert out.exists(), f"no report (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    assert sorted(f.name for f in tmpdir.iterdir()) == []
    report = json.loads(out.read_text())
    print(p.stdout)
    return report


def check(report: dict, faces: list[str], min_total: int = 2000, only: set[str] | None = None) -> None:
    assert not report["failures"], f"triton {report['triton']}:\n" + "\n\n".join(report["failures"][:10])
    assert set(report["faces"]) == set(faces), report["faces"]
    total = 0
    for face, kernels in report["faces"].items():
        if face == "bundle":  # the C++ program's launches, compared one by one with Triton's
            assert set(kernels) == {"optional_inputs", "int_kinds", "heuristic_on_int"}, kernels
            n = sum(k["calls"] for k in kernels.values())
            assert n >= 3 * (CALLS // 8) * 3 // 4 and report["bundle_launches_compared"] == n, (kernels, report)
            total += n
            continue
        want = KERNELS if face != "jax" else JAX_KERNELS
        if only is not None:
            want = want & only
        if "desc_scale" not in kernels:  # a Triton without host tensor descriptors
            want = want - {"desc_scale"}
        assert set(kernels) == want, (face, kernels)
        for name, k in kernels.items():
            total += k["calls"]
            # The sequences really cross specializations (the templates differ).
            assert k["specializations"] >= 4, (face, name, k)
            assert k["refused"] < k["calls"] // 4, (face, name, k)
            # and pass keywords beside the arguments (launch options, values a heuristic sets) now and then,
            # then each keyword pattern once: on an autotuned kernel Triton refuses num_warps, num_stages,
            # num_ctas (every triton.Config sets them) and a config's meta-parameter, and takes the others.
            assert k["keywords"] >= k["calls"] // 10 or CALLS < 80, (face, name, k)
            assert k["sweep"]["calls"] >= 4, (face, name, k)
            if name in AUTOTUNED and face != "jax":
                assert k["sweep"]["refused"] == 5, (face, name, k)
    assert total >= min_total or CALLS < 200, total


@pytest.fixture(scope="module")
def shared_triton_cache(tmp_path_factory):
    """One Triton cache for the faces' probes: a kernel compiled for one face is found by the next."""
    return tmp_path_factory.mktemp("differential-triton")


# One probe per face, and the two Python faces' kernels in two halves each, so that a parallel run
# (pytest -n) spreads them over its workers.
_HALVES = [set(sorted(KERNELS)[0::2]), set(sorted(KERNELS)[1::2])]


@pytest.mark.heavy
@pytest.mark.parametrize("face,part", [("generic", 0), ("generic", 1), ("generated", 0), ("generated", 1),
                                       ("jax", None), ("bundle", None)],
                         ids=["generic-a", "generic-b", "generated-a", "generated-b", "jax", "bundle"])
def test_differential_on_the_installed_triton(face, part, fake_driver, bundle_calls_exe, shared_triton_cache,
                                              tmp_path):
    if face == "jax":
        pytest.importorskip("jax")
    if face == "bundle" and bundle_calls_exe is None:
        pytest.skip("no cmake: the C++ program that launches bundles cannot be built")
    only = _HALVES[part] if part is not None else None
    report = run_probe(sys.executable, fake_driver, tmp_path, face, bundle_calls_exe if face == "bundle" else None,
                       triton_cache=shared_triton_cache, kernels=only)
    # What each face's sequences add up to at the default length (fewer kernels on the JAX and C++ faces).
    least = {"generic": 500, "generated": 500, "jax": 120, "bundle": 100}[face]
    check(report, [face], min_total=least if part is None else least * len(only) // len(KERNELS), only=only)


@pytest.mark.parametrize("version", VERSIONS)
def test_differential_on_triton_version(version, fake_driver, tmp_path):
    from test_triton_versions import MATRIX, REPO, VENVS, _module

    venv = VENVS / f"triton-{version}"
    py = venv / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no venv for triton {version} at {venv}: run tests/triton_versions/setup_venvs.sh")
    stamp = _module("lt_triton_stamp", MATRIX / "stamp.py")
    made_from = (venv / "lazytriton-sources.sha256").read_text().strip() \
        if (venv / "lazytriton-sources.sha256").exists() else None
    if made_from != stamp.source_digest(REPO):
        pytest.fail(f"{venv} holds a lazytriton built from other sources than this checkout's: run "
                    f"tests/triton_versions/setup_venvs.sh {version}")
    report = run_probe(str(py), fake_driver, tmp_path, "generic,generated")
    if version != "newest":
        assert report["triton"].startswith(version + "."), report["triton"]
    check(report, ["generic", "generated"])


EMPTY_BUFFER = """
import triton, triton.language as tl, lazytriton
from lazytriton.model.arrays import DeviceArray

@triton.autotune(configs=[triton.Config({"B": 32}), triton.Config({"B": 64})], key=["n"])
@triton.jit
def fill(out, probs, n, HAS: tl.constexpr, B: tl.constexpr):
    offs = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(out + offs, 1.0, mask=offs < n)
    if HAS:
        tl.store(probs + offs, 2.0, mask=offs < 0)

k = lazytriton.kernel(fill)
out = DeviceArray(0x7F0000000000, "fp32", 4000)
k[lambda m: (triton.cdiv(100, m["B"]),)](out, DeviceArray(0, "fp32", 0), 100, HAS=True, stream=0)
print("tuned", lazytriton.stats()["tunes"])
"""


def test_an_empty_buffer_is_not_snapshotted(fake_driver, tmp_path):
    """A zero-size array the kernel may write (TransformerEngine's permuted_probs when
    probs is None, as XLA hands it: an address no allocation holds) has nothing to
    save around tuning trials: lazytriton once asked the driver for its allocation
    (cuMemGetAddressRange: CUDA_ERROR_NOT_FOUND on every candidate)."""
    script = tmp_path / "empty_buffer.py"  # Triton reads a kernel's source from its file
    script.write_text(EMPTY_BUFFER)
    p = subprocess.run([sys.executable, str(script)], env=_env(fake_driver, tmp_path), cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "tuned 1" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]
