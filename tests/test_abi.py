"""lazytriton builds without a CUDA toolkit, so csrc/include/lazytriton/cuda_abi.h and
driver_fns.inc re-declare the driver types, enum values, struct layouts and entry
point signatures it uses. abi_check.cc static_asserts each of them against a real
cuda.h (the one in Triton's wheel, else a CUDA toolkit's); a mistake there would
pass garbage to the driver at run time, on a GPU only."""
import os
import re
import shlex
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "csrc" / "include"
CHECK = Path(__file__).with_name("abi_check.cc")


def cuda_include() -> Path:
    dirs = [Path(triton.__file__).parent / "backends" / "nvidia" / "include"]
    dirs += [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    dirs.append(Path("/usr/local/cuda/include"))
    for d in dirs:
        if (d / "cuda.h").exists() and (d / "cudaTypedefs.h").exists():
            return d
    pytest.skip("no cuda.h with cudaTypedefs.h (neither in Triton's wheel nor in a CUDA toolkit)")


def compile_check(include: Path) -> subprocess.CompletedProcess:
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    if not shutil.which(cxx[0]):
        pytest.skip(f"no C++ compiler ({cxx[0]})")
    cmd = [*cxx, "-std=c++17", "-fsyntax-only", f"-I{include}", f"-I{cuda_include()}", str(CHECK)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_declarations_match_cuda_h():
    r = compile_check(INCLUDE)
    assert r.returncode == 0, r.stderr[-4000:]


# The check must be able to fail: break one declaration of each kind in a copy.
@pytest.mark.parametrize("file, old, new, message", [
    ("cuda_abi.h", "CLUSTER_LAUNCH = 120", "CLUSTER_LAUNCH = 121",
     "CLUSTER_LAUNCH != CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH"),
    ("cuda_abi.h", "  int cooperative;", "  long cooperative;", "CUlaunchAttributeValue.cooperative size"),
    ("cuda_abi.h", "unsigned blockDimX, blockDimY, blockDimZ;", "unsigned blockDimY, blockDimX, blockDimZ;",
     "CUlaunchConfig.blockDimX offset"),
    ("driver_fns.inc", "LT_DRIVER_FN(cuMemsetD8Async, cu::CUdeviceptr, unsigned char,",
     "LT_DRIVER_FN(cuMemsetD8Async, cu::CUdeviceptr, unsigned,", "cuMemsetD8Async: signature differs"),
    ("driver_fns.inc", "LT_DRIVER_FN(cuStreamGetCtx, cu::CUstream, cu::CUcontext*)",
     "LT_DRIVER_FN(cuStreamGetCtx, cu::CUstream, cu::CUcontext*, void*)", "cuStreamGetCtx: signature differs"),
    ("driver_fns.inc", "cu::CUtensorMap*, int, uint32_t, void*, const uint64_t*, const uint64_t*, const uint32_t*,",
     "cu::CUtensorMap*, int, uint32_t, void*, const uint64_t*, const uint32_t*, const uint32_t*,",
     "cuTensorMapEncodeTiled: signature differs"),
    ("cuda_abi.h", "struct alignas(128) CUtensorMap", "struct alignas(64) CUtensorMap", "CUtensorMap alignment"),
    ("cuda_abi.h", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA = 1", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA = 2",
     "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA != CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA"),
], ids=["enum-value", "union-member-size", "struct-field-order", "parameter-type", "parameter-count",
        "tensor-map-strides", "tensor-map-alignment", "tensor-map-oob-fill"])
def test_a_wrong_declaration_fails_the_check(tmp_path, file, old, new, message):
    copy = tmp_path / "include"
    shutil.copytree(INCLUDE, copy)
    path = copy / "lazytriton" / file
    text = path.read_text()
    assert old in text, f"{file} changed: update this test's mutation"
    path.write_text(text.replace(old, new, 1))
    r = compile_check(copy)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-4000:]


def test_entry_point_versions_are_those_lazytriton_requests():
    # driver.cc asks cuGetProcAddress for the ABI of one CUDA version: each entry point
    # then has the signature of its newest version not newer than that one.
    abi = int(re.search(r"kRequestedAbi\s*=\s*(\d+)", (ROOT / "csrc" / "core" / "driver.cc").read_text()).group(1))
    versions = defaultdict(set)
    for name, v in re.findall(r"\*\s*PFN_(\w+?)_v(\d+)\)", (cuda_include() / "cudaTypedefs.h").read_text()):
        versions[name].add(int(v))
    used = re.findall(r"^LT_DRIVER_(?:OPTIONAL_)?FN\((\w+)", (INCLUDE / "lazytriton" / "driver_fns.inc").read_text(),
                      re.M)
    chosen = {n: int(v) for n, v in re.findall(r"using pfn_(\w+) = PFN_\1_v(\d+);", CHECK.read_text())}
    assert used and set(used) <= set(chosen), set(used) - set(chosen)
    for name in used:
        assert chosen[name] == max(v for v in versions[name] if v <= abi), (name, sorted(versions[name]))
