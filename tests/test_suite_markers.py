"""README's quick GPU command stays quick: the tests that take minutes on one worker (runs under
compute-sanitizer) carry the `slow` marker it leaves out, and the field corpus's long call
sequences are split into parts that pytest-xdist runs side by side. Checked by collecting
(nothing runs), on any machine where the modules import."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLOW_MODULES = ["tests/test_gpu_memcheck.py", "tests/test_gpu_capture_matrix.py", "tests/test_gpu_field.py"]


def collected(marker_expr: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-m", marker_expr, *SLOW_MODULES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 5), r.stdout[-3000:] + r.stderr[-3000:]  # 5: nothing collected
    return [line for line in r.stdout.splitlines() if "::" in line]


@pytest.mark.heavy
def test_readmes_quick_gpu_command_leaves_the_sanitizer_runs_out():
    pytest.importorskip("jax")  # the modules skip without it
    quick = re.search(r'`pytest -m "([^"]+)" -n 14`', (ROOT / "README.md").read_text()).group(1)
    assert "not slow" in quick and "not exclusive_gpu" in quick
    ids = collected(quick)
    assert ids and not [i for i in ids if "memcheck" in i], [i for i in ids if "memcheck" in i]
    slow = collected("slow")
    assert any("test_gpu_memcheck.py" in i for i in slow) and any("memcheck" in i for i in slow)
    assert all("memcheck" in i for i in slow), slow


def test_field_sequences_are_split_into_parts():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("tests/test_gpu_field.py needs torch to be collected")
    ids = collected("not slow")
    for name in ("test_liger_cross_entropy_sequence", "test_liger_rms_norm_sequence", "test_te_permutation_sequence",
                 "test_fla_fused_recurrent_sequence", "test_jax_liger_rms_norm"):
        assert sum(f"::{name}[" in i for i in ids) == 3, (name, [i for i in ids if name in i])
