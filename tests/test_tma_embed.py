"""Host TMA descriptors in C++ bundles without a GPU: a variant records a
descriptor argument as Triton's type (tensordesc<fp16[64, 64]>), the C++
runtime binds such a signature, builds lt::TensorDesc arguments and checks
them (clear errors naming the kernel and the argument), typed stubs take
`const lt::TensorDesc&`. Real sm_90 cubins; launches need a GPU
(test_gpu_tma.py)."""
import json
import subprocess

import pytest

import lazytriton
from lazytriton import _core, paths
from lazytriton.cpp import bundle, export as export_cpp
from lazytriton.model import tensor_desc, tuples
from lazytriton.model.arrays import DeviceArray, PointerArg
from lazytriton.compile.compiler import Binder, Candidate, compile_all
from lazytriton.compile.targets import default_target
from lazytriton.runtime.resolve import Resolved
from lazytriton.model.spec import kernel_spec

from kernels import tma
from test_embed import CMAKE, CPP_CHECKS, check_lines, cmake_build, cmake_project, run
from test_tma import INSTALLED_ABI

SOURCE = "kernels.tma:tma_copy_kernel"
BASE = 0x7F0000000000


def copy_variant(block=(64, 64)) -> tuple[dict, dict, bytes]:
    """(description, variant, cubin) of tma_copy_kernel for a (256, 128) fp16 descriptor, compiled for sm_90."""
    spec, desc = kernel_spec(tma.tma_copy_kernel), bundle.describe(tma.tma_copy_kernel, SOURCE)
    d = lazytriton.TensorDescriptor.from_tensor(DeviceArray(BASE, "fp16", 256 * 128 * 2, (256, 128)), list(block))
    info = tensor_desc.read(d, "d")
    out = DeviceArray(BASE + 2**20, "fp16", 2 * block[0] * block[1])
    meta = {"M": block[0], "N": block[1]}
    cand = Candidate(0, None, Binder(spec, default_target()).bind(
        (), {"in_desc": tensor_desc.bind_value(info), "out_ptr": PointerArg(out.ptr, "fp16"), **meta}))
    compile_all(spec, default_target(), [cand])
    assert cand.binary is not None, cand.error
    kern = _core.Kernel(cand.binary.cubin, cand.binary.metadata)
    values = [d, out, block[0], block[1]]
    res = Resolved(_core.Entry(kern, [True, True, False, False], {}), ["in_desc", "out_ptr", "M", "N"],
                   tuple(values), [info.type_string(), "*fp16", "constexpr", "constexpr"], {}, None, ())
    variant, cubin = bundle.make_variant(desc, None, res, values, {}, device="compiled without a GPU")
    return desc, variant, cubin


def test_variant_records_the_descriptor_type(tmp_path):
    desc, variant, cubin = copy_variant()
    assert variant["types"] == ["tensordesc<fp16[64, 64]>", "*fp16", "constexpr", "constexpr"]
    assert variant["specs"] == ["", "16", "", ""]
    assert variant["signature"] == "tensordesc<fp16[64, 64]>,*fp16:16"
    assert variant["launch"]["tensordesc_meta"][0]["block_size"] == [64, 64]
    assert variant["launch"]["lt_tensordesc_abi"] == INSTALLED_ABI
    bundle.write_variant(tmp_path, desc, variant, cubin)
    assert bundle.Bundle(tmp_path).variants()[0]["types"][0] == "tensordesc<fp16[64, 64]>"


def test_cpp_bundles_read_the_descriptor_metadata():
    # What an AOT launch encodes with: the variant's tensordesc_meta and parameter layout, read by the C++ reader.
    _, variant, _ = copy_variant((32, 64))
    launch = variant["launch"]
    got = _core.launch_meta_from_json(json.dumps(launch))
    assert got["tensordesc_meta"] == launch["tensordesc_meta"] and got["tensordesc_meta"][0]["block_size"] == [32, 64]
    assert got["lt_tensordesc_abi"] == INSTALLED_ABI
    older = {k: v for k, v in launch.items() if k != "lt_tensordesc_abi"}
    assert _core.launch_meta_from_json(json.dumps(dict(older, triton_version="3.6.0")))["lt_tensordesc_abi"] == 1
    with pytest.raises(lazytriton.RuntimeFailure, match="block_size must have 1 to 5 entries"):
        _core.launch_meta_from_json(json.dumps(dict(launch, tensordesc_meta=[dict(launch["tensordesc_meta"][0],
                                                                                 block_size=[])])))


def test_export_cpp_takes_descriptors_by_reference():
    desc = bundle.describe(tma.tma_copy_kernel, SOURCE)
    _, header, source = export_cpp.generate(desc, "tensordesc<fp16[64, 64]>, *fp16", {"M": 64, "N": 64})
    assert "void launch_tma_copy_kernel(lt::Stream stream, lt::Dim3 grid, const lt::TensorDesc& in_desc, " \
           "lt::DevicePtr out_ptr);" in header
    assert 'kSignature = "tensordesc<fp16[64, 64]>,*fp16"' in source
    with pytest.raises(ValueError, match="argument in_desc: unknown type 'tensordesc<fp16>'"):
        export_cpp.generate(desc, "tensordesc<fp16>, *fp16", {"M": 64, "N": 64})
    assert tuples.split_top("tensordesc<fp16[64,64]>,*fp16, [i32, tensordesc<fp32[8, 16]>]") == [
        "tensordesc<fp16[64,64]>", "*fp16", "[i32, tensordesc<fp32[8, 16]>]"]


API_TEST = CPP_CHECKS + r"""
#include "launch_tma_copy_kernel.h"

int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  // Triton's spelling, spaces optional.
  auto k = b.kernel("tma_copy_kernel", "tensordesc<fp16[64,64]>, *fp16", {{"M", 64}, {"N", 64}});
  std::printf("signature: %s\n", k.signature().c_str());
  // No C++ type is fp16 here: untyped addresses (the signature gives the element type).
  lt::DevicePtr base(0x7F0000000000ull), out(0x7F0000100000ull);
  lt::TensorDesc d(base, {256, 128}, {128, 1}, {64, 64});
  std::printf("spec: %s\n", k.specialization({d, out}).c_str());
  lt::TensorDesc raw(lt::DevicePtr(0x7F0000000000ull), {256, 128}, {128, 1}, {64, 64}, lt::TensorDesc::kNan);
  std::printf("spec raw: %s\n", k.specialization({raw, out}).c_str());
  lt::TensorDesc other_block(base, {256, 128}, {128, 1}, {32, 64});
  TRY("block", k.specialization({other_block, out}));
  lt::TensorDesc rank(base, {256, 128}, {128, 1}, {64});
  TRY("rank", k.specialization({rank, out}));
  lt::TensorDesc strides(base, {256, 100}, {100, 1}, {64, 64});
  TRY("strides", k.specialization({strides, out}));
  lt::TensorDesc contiguous(base, {256, 128}, {128, 2}, {64, 64});
  TRY("contiguous", k.specialization({contiguous, out}));
  lt::TensorDesc aligned(lt::DevicePtr(0x7F0000000008ull), {256, 128}, {128, 1}, {64, 64});
  TRY("aligned", k.specialization({aligned, out}));
  lt::TensorDesc f32(reinterpret_cast<float*>(uintptr_t(0x7F0000000000)), {256, 128}, {128, 1}, {64, 64});
  TRY("dtype", k.specialization({f32, out}));
  TRY("not a descriptor", k.specialization({base, out}));
  TRY("bad type", b.kernel("tma_copy_kernel", "tensordesc<fp16>, *fp16", {{"M", 64}, {"N", 64}}));
  TRY("no winner", b.kernel("tma_copy_kernel", "tensordesc<fp16[32, 64]>, *fp16", {{"M", 64}, {"N", 64}}));
  if (lt::driver_available())
    report("launch", "skipped: a GPU is present");
  else
    TRY("launch", launch_tma_copy_kernel(k, nullptr, lt::Dim3{1}, d, out));
}
"""

API_CMAKE = cmake_project("tma_api_test", "tma_api_test.cc", "launch_tma_copy_kernel.cc")


@pytest.fixture(scope="module")
def api_output(tmp_path_factory) -> dict:
    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    d = tmp_path_factory.mktemp("tma-bundle")
    bundle.write_variant(d, *copy_variant())
    src = tmp_path_factory.mktemp("tma-api-src")
    (src / "tma_api_test.cc").write_text(API_TEST)
    (src / "CMakeLists.txt").write_text(API_CMAKE)
    export_cpp.export(SOURCE, "tensordesc<fp16[64, 64]>,*fp16", {"M": 64, "N": 64}, src)
    cmake_build(src, src / "build")
    return check_lines(run(src / "build" / "tma_api_test", d))


def test_cpp_binds_a_descriptor_signature(api_output):
    assert api_output["signature"] == ["tensordesc<fp16[64,64]>, *fp16"]
    assert api_output["spec"] == ["tensordesc<fp16[64, 64]>,*fp16:16"]
    assert api_output["spec raw"] == ["tensordesc<fp16[64, 64]>,*fp16:16"]


@pytest.mark.parametrize("label, message", [
    ("block", "kernel tma_copy_kernel: argument in_desc: a descriptor with block shape [32, 64] where the signature "
              "says tensordesc<fp16[64, 64]>"),
    ("rank", "argument in_desc: its shape, strides and block_shape must have the same length, 1 to 5"),
    ("strides", "argument in_desc: strides [100, 1]: every stride but the last must be a multiple of 16 bytes"),
    ("contiguous", "argument in_desc: strides [128, 2]: the last dimension must be contiguous"),
    ("aligned", "argument in_desc: its base address 0x7f0000000008 is not 16-byte aligned"),
    ("dtype", "argument in_desc: a descriptor over fp32 where the signature says tensordesc<fp16[64, 64]>"),
    ("not a descriptor", "argument in_desc: expects a tensor descriptor (tensordesc<fp16[64, 64]>), got a device "
                         "pointer; make one with lt::TensorDesc"),
    ("bad type", "argument in_desc: bad descriptor type 'tensordesc<fp16>' in the signature"),
    ("no winner", "has no winner for signature tensordesc<fp16[32, 64]>, *fp16 M=64 N=64; its winners are: |   "
                  "sm_90 tensordesc<fp16[64, 64]>,*fp16:16 M=64 N=64"),
])
def test_cpp_descriptor_errors_name_kernel_and_argument(api_output, label, message):
    (got,) = api_output[label]
    assert message in got, got


@pytest.mark.skipif(lazytriton.gpu_available()[0], reason="checks the machine without a GPU")
def test_cpp_descriptor_launch_without_gpu_is_an_error(api_output):
    (got,) = api_output["launch"]
    assert "no CUDA driver" in got or "no usable CUDA device" in got or "no CUDA device" in got, got


def test_header_compiles_standalone(tmp_path):
    # bundle.h with descriptors, on its own (what a C++ program includes).
    src = tmp_path / "t.cc"
    src.write_text('#include <lazytriton/bundle.h>\n'
                   'int main() { float* p = nullptr; lt::TensorDesc d(p, {4, 4}, {4, 1}, {4, 4});\n'
                   '  lt::Arg a(d); return a.kind() == lt::Arg::kDesc ? 0 : 1; }\n')
    cmd = ["c++", "-std=c++17", "-fsyntax-only", f"-I{paths.include_dir()}", str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.cc"  # a temporary descriptor cannot become an Arg (it would dangle)
    bad.write_text('#include <lazytriton/bundle.h>\n'
                   'int main() { float* p = nullptr; lt::Arg a(lt::TensorDesc(p, {4}, {1}, {4})); return 0; }\n')
    r = subprocess.run([*cmd[:-1], str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "deleted" in r.stderr
