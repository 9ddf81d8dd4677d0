"""lazytriton builds without ROCm, so csrc/core/hip_abi.h re-declares
the HIP runtime's enum values, struct layouts and entry point signatures
(hip_fns.inc) that its HIP driver layer (csrc/core/hip_driver.cc) uses. hip_abi_check.cc static_asserts each of them
against the hip_runtime_api.h in Triton's wheel; a mistake there would pass
garbage to the HIP runtime, on an AMD GPU only."""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "csrc" / "include"
CORE = ROOT / "csrc" / "core"  # hip_abi.h and hip_fns.inc: private to the HIP driver layer
CHECK = Path(__file__).with_name("hip_abi_check.cc")
HIP_INCLUDE = Path(triton.__file__).parent / "backends" / "amd" / "include"


def compile_check(include: Path, core: Path = CORE) -> subprocess.CompletedProcess:
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    if not shutil.which(cxx[0]):
        pytest.skip(f"no C++ compiler ({cxx[0]})")
    if not (HIP_INCLUDE / "hip" / "hip_runtime_api.h").exists():
        pytest.skip("no hip_runtime_api.h in Triton's wheel")
    cmd = [*cxx, "-std=c++17", "-fsyntax-only", "-D__HIP_PLATFORM_AMD__", f"-I{include}", f"-I{core}",
           f"-I{HIP_INCLUDE}", str(CHECK)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_declarations_match_hip_runtime_api_h():
    r = compile_check(INCLUDE)
    assert r.returncode == 0, r.stderr[-4000:]


# The check must be able to fail: break one declaration of each kind in a copy.
@pytest.mark.parametrize("file, old, new, message", [
    ("hip_fns.inc", "X(hipMemsetD8Async, h::hipDeviceptr_t, unsigned char,", "X(hipMemsetD8Async, h::hipDeviceptr_t, unsigned,",
     "hipMemsetD8Async: signature differs"),
    ("hip_fns.inc", "h::hipStream_t, void**) /* no `extra`", "h::hipStream_t, void**, void**) /* no `extra`",
     "hipModuleLaunchCooperativeKernel: signature differs"),
    ("hip_abi.h", "hipDeviceAttributeWarpSize = 87", "hipDeviceAttributeWarpSize = 88", "hipDeviceAttributeWarpSize != "),
    ("hip_abi.h", "hipDeviceAttributeMaxSharedMemoryPerMultiprocessor = 10002",
     "hipDeviceAttributeMaxSharedMemoryPerMultiprocessor = 82", "hipDeviceAttributeMaxSharedMemoryPerMultiprocessor != "),
    ("hip_abi.h", "unsigned blockDimX, blockDimY, blockDimZ;", "unsigned blockDimY, blockDimX, blockDimZ;",
     "HIP_LAUNCH_CONFIG.blockDimX offset"),
    ("hip_abi.h", "kDevicePropArchNameOffset = 1160", "kDevicePropArchNameOffset = 1164", "gcnArchName offset"),
    ("hip_abi.h", "  int cooperative;\n};", "  long cooperative;\n};", "hipLaunchAttributeValue.cooperative size"),
])
def test_the_check_catches_a_wrong_declaration(tmp_path, file, old, new, message):
    dst = tmp_path / "core"
    shutil.copytree(CORE, dst)
    text = (dst / file).read_text()
    assert old in text, old
    (dst / file).write_text(text.replace(old, new))
    r = compile_check(INCLUDE, dst)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-3000:]
