"""Compiling candidates to cubin without a GPU (compiler.compile_all), for sm_80 and
sm_90: the binary must be a CUDA ELF for that architecture, carry the metadata
the C++ core reads (csrc/python/core_module.cc meta_from), and take the kernel
parameters lazytriton's Kernel::launch passes: the runtime arguments, then the
global and profile scratch pointers. Configs that fail are skipped with their
reason; when all fail, AllCandidatesFailed lists every reason."""
import logging
import re
import struct
import subprocess
import time
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

import lazytriton
from lazytriton import _core
from lazytriton.model.arrays import DeviceArray
from lazytriton.cache import Cache
from lazytriton.compile.compiler import AllCandidatesFailed, Binder, Candidate, compile_all
from lazytriton.runtime.resolve import Resolution
from lazytriton.model.spec import kernel_spec

from kernels import basic

EM_CUDA = 190
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
X = DeviceArray(0x7F0000000000, "fp32", 4096)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=2), triton.Config({"BLOCK": 1024}, num_warps=8)],
                 key=["n"])
@triton.jit
def scale_kernel(x, out, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * alpha, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 3}), triton.Config({"BLOCK": 5})],
                 key=["n"])
@triton.jit
def partly_bad_kernel(x, n, BLOCK: tl.constexpr):
    # tl.arange needs a power-of-2 range: BLOCK=3 and BLOCK=5 fail to compile.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)


def candidates(kernel, args: tuple, target: GPUTarget) -> list[Candidate]:
    """One candidate per config, bound by Triton's binder as the runtime does."""
    spec = kernel_spec(kernel)
    binder = Binder(spec, target)
    return [Candidate(i, cfg, binder.bind(args, cfg.all_kwargs() if cfg else {}))
            for i, cfg in enumerate(spec.configs or [None])]


def elf_arch(cubin: bytes) -> int:
    assert cubin[:4] == b"\x7fELF" and cubin[4] == 2, "a 64-bit ELF"
    (machine,) = struct.unpack_from("<H", cubin, 18)
    assert machine == EM_CUDA
    (flags,) = struct.unpack_from("<I", cubin, 48)
    # The CUDA ELF ABI moved the SM number from bits 0-7 to bits 8-15 in ABI version 8.
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


def cuobjdump(cubin: bytes, tmp_path: Path) -> str:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    return subprocess.run([str(CUOBJDUMP), "-elf", str(path)], capture_output=True, text=True, check=True).stdout


PARAM_BYTES = {"i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8}


def check_binary(c: Candidate, name: str, arch: int, tmp_path: Path) -> None:
    assert c.error is None and c.binary is not None, c.error
    assert elf_arch(c.binary.cubin) == arch
    md = c.binary.metadata
    # What meta_from reads: "name" (the cubin symbol) is mandatory there, the rest must match the options.
    assert md["name"] == name
    assert md["num_warps"] == c.bound.options.num_warps and md["num_ctas"] == 1
    assert isinstance(md["shared"], int) and md["shared"] >= 0
    assert isinstance(md["global_scratch_size"], int) and md["global_scratch_align"] >= 1
    assert md["target"]["arch"] == arch
    core = _core.Kernel(c.binary.cubin, md).metadata  # parsed by the C++ core
    assert (core["name"], core["num_warps"], core["shared"], core["arch"]) == (md["name"], md["num_warps"],
                                                                                md["shared"], arch)
    assert core["global_scratch_size"] == md["global_scratch_size"]
    assert core["profile_scratch_size"] == md.get("profile_scratch_size", 0)
    if CUOBJDUMP.exists():
        dump = cuobjdump(c.binary.cubin, tmp_path)
        assert re.search(rf"\bsm={arch}a?\b", dump), dump[:300]
        # Kernel parameters: the runtime arguments, then 2 scratch pointers (8 bytes each).
        params = re.findall(r"Ordinal\s*:\s*(0x[0-9a-f]+).*?Size\s*:\s*(0x[0-9a-f]+)", dump)
        sizes = {int(o, 16): int(s, 16) for o, s in params}
        runtime = c.bound.runtime_types()
        expected = [8 if t.startswith("*") else PARAM_BYTES[t] for t in runtime] + [8, 8]
        assert [sizes[i] for i in sorted(sizes)] == expected, (runtime, sizes)


@pytest.mark.parametrize("arch", [80, 90])
def test_jit_kernel_to_cubin(arch, tmp_path):
    target = GPUTarget("cuda", arch, 32)
    (c,) = candidates(basic.add_kernel, (X, X, X, 1000, 256), target)
    compile_all(kernel_spec(basic.add_kernel), target, [c])
    check_binary(c, "add_kernel", arch, tmp_path)


@pytest.mark.parametrize("arch", [80, 90])
def test_autotuned_kernel_to_cubin(arch, tmp_path):
    target = GPUTarget("cuda", arch, 32)
    cands = candidates(scale_kernel, (X, X, 2.0, 1000), target)
    stored = []
    compile_all(kernel_spec(scale_kernel), target, cands, store=lambda c, b: stored.append(c.index))
    assert sorted(stored) == [0, 1]
    for c, warps in zip(cands, (2, 8)):
        assert c.binary.metadata["num_warps"] == warps
        check_binary(c, "scale_kernel", arch, tmp_path)
    # The configs are really different binaries.
    assert cands[0].binary.cubin != cands[1].binary.cubin


@pytest.mark.parametrize("late", [None, 1], ids=["as_they_come", "config_1_finishing_last"])
def test_failing_config_is_skipped_with_its_reason(caplog, monkeypatch, late):
    if late is not None:
        # Configs' back ends on threads here, config 1's last: alike errors still name config 1
        # (they named whichever finished first, and a loaded machine reordered them).
        from lazytriton.compile import compiler, ir_text

        front, back = compiler._front_end, ir_text.compile_text

        def marked(spec, fn, target, c):
            job = front(spec, fn, target, c)
            return dict(job, ir=dict(job["ir"], late=c.index == late))

        def slow(ir, target):
            if ir.get("late"):
                time.sleep(1.0)
            return back(ir, target)

        monkeypatch.setattr(compiler, "_front_end", marked)
        monkeypatch.setattr(ir_text, "compile_text", slow)
    target = GPUTarget("cuda", 90, 32)
    cands = candidates(partly_bad_kernel, (X, 1000), target)
    with caplog.at_level(logging.WARNING, logger="lazytriton.compile.compiler"):
        compile_all(kernel_spec(partly_bad_kernel), target, cands, max_workers=None if late is None else 3)
    good, *bad = cands
    assert good.binary is not None and good.error is None
    for c in bad:
        assert c.binary is None and c.error
    # Triton's whole message (the source line, the caret, the cause), once for configs that fail alike.
    text = caplog.text
    assert re.search(r"partly_bad_kernel: config 1 \(.*BLOCK: 3.*\) skipped: CompilationError: at 3:38:\n"
                     r"def partly_bad_kernel.*\n.*\n.*tl.arange\(0, BLOCK\)\n *\^\n"
                     r"arange's range must be a power of 2", text), text
    assert re.search(r"partly_bad_kernel: config 2 \(.*BLOCK: 5.*\) skipped: the same error as config 1$", text,
                     re.M), text
    assert text.count("must be a power of 2") == 1


def test_all_configs_failing_raises_all_candidates_failed(cache_dir, caplog):
    # Resolution._tune is what a first call runs after picking the target; here it is
    # given sm_90 directly, since without a GPU there is no device to ask.
    @triton.autotune(configs=[triton.Config({"BLOCK": 3}), triton.Config({"BLOCK": 5})], key=["n"])
    @triton.jit
    def all_bad(x, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x + offs, 1.0, mask=offs < n)

    k = lazytriton.kernel(all_bad)
    args = (X, 1000)
    res = Resolution(k, (0,), args, 0, (1,), k._shape(args))
    res.target = GPUTarget("cuda", 90, 32)
    with pytest.raises(AllCandidatesFailed) as info:
        res._tune(Cache(cache_dir), "test-key", res._candidates(), True)
    text = str(info.value)
    # Both fail alike: Triton's whole message once (source line, caret, cause).
    assert text.startswith("kernel all_bad: every candidate config (2) failed with:\nCompilationError: at 2:")
    assert "offs = tl.arange(0, BLOCK)\n" in text and "^\n" in text and text.count("power of 2") == 1
    assert len(info.value.candidates) == 2 and all(c.error for c in info.value.candidates)


def test_all_candidates_failed_differently_lists_each(cache_dir):
    from lazytriton.compile.compiler import Candidate

    cands = [Candidate(0, triton.Config({"BLOCK": 3}), None, error="CompilationError: at 1:2:\nx\n^\ncause A"),
             Candidate(1, triton.Config({"BLOCK": 5}), None, error="PTXASError: ptxas failed\nline 2")]
    text = str(AllCandidatesFailed("k", cands))
    assert text.startswith("kernel k: every candidate config failed:\n  config 0 (")
    assert "cause A" in text and "    line 2" in text and "config 1 (" in text
