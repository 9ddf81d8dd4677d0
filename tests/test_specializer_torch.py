"""Triton's native specializer imports torch on its first use; lazytriton's
first call must not pay for that import in a process that has not imported
torch (a JAX process). Checked with a real `torch` package on the path that
records being imported."""
import json
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import json, sys
    import triton, triton.language as tl
    from lazytriton.compile.compiler import Binder
    from lazytriton.compile.targets import default_target
    from lazytriton.model.spec import kernel_spec
    from lazytriton.model.arrays import PointerArg

    @triton.jit
    def k(x, n, BLOCK: tl.constexpr):
        pass

    before = "torch" in sys.modules
    if sys.argv[1] in ("wrap", "wrap-then-import"):  # priming starts in the background when a kernel is wrapped
        import lazytriton, lazytriton.model.specialize as specialize
        lazytriton.kernel(k)
        if sys.argv[1] == "wrap-then-import":  # while the priming thread may be running: this thread sees torch
            import torch
            assert torch.IMPORTED
        specialize._priming.join(60)
        assert specialize._specializer_primed
    if sys.argv[1] != "triton":
        b = Binder(kernel_spec(k), default_target()).bind((PointerArg(256, "fp16"), 32), {"BLOCK": 64})
        sig = b.signature
    else:  # Triton's specializer used directly: the control
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
        native_specialize_impl(BaseBackend, 16, False, True, True)
        sig = None
    after_bind = "torch" in sys.modules
    import torch  # still importable afterwards
    print(json.dumps({"before": before, "after_bind": after_bind, "signature": sig,
                      "imported_later": torch.IMPORTED}))
""")


def _run(tmp_path, how):
    pkg = tmp_path / "torch"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("IMPORTED = True\nclass Tensor:\n    pass\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "LAZYTRITON_COMPILE_WORKERS": "0"}
    (tmp_path / "probe.py").write_text(PROBE)
    out = subprocess.run([sys.executable, str(tmp_path / "probe.py"), how], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_triton_specializer_imports_torch_on_first_use(tmp_path):
    """The control: shows the import the next test proves lazytriton avoids."""
    native = pytest.importorskip("triton._C.libtriton")
    if not hasattr(native, "native_specialize_impl"):
        pytest.skip("this Triton has no native specializer")
    r = _run(tmp_path, "triton")
    assert r["before"] is False
    if not r["after_bind"]:
        pytest.skip(f"triton {__import__('triton').__version__}'s specializer does not import torch (3.5/3.6 do)")


def test_first_bind_does_not_import_torch(tmp_path):
    r = _run(tmp_path, "lazytriton")
    assert r["before"] is False
    assert r["after_bind"] is False, "lazytriton's first bind imported torch"
    assert r["signature"] == {"x": "*fp16", "n": "i32", "BLOCK": "constexpr"}
    assert r["imported_later"] is True


def test_priming_when_a_kernel_is_wrapped_does_not_import_torch(tmp_path):
    r = _run(tmp_path, "wrap")
    assert r["before"] is False
    assert r["after_bind"] is False, "priming Triton's specializer imported torch"
    assert r["signature"] == {"x": "*fp16", "n": "i32", "BLOCK": "constexpr"}


def test_torch_stays_importable_by_other_threads_while_priming(tmp_path):
    r = _run(tmp_path, "wrap-then-import")
    assert r["imported_later"] is True
    assert r["signature"] == {"x": "*fp16", "n": "i32", "BLOCK": "constexpr"}
