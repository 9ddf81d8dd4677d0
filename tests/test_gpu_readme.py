"""README's examples run as written (issue 25): its usage example after its
set-up (CuPy from the cupy-cuda12x / cupy-cuda13x extra), and its JAX example
with the usage example's kernel as add_kernel (the signature README's C++
example declares: x, y, out, n), and the example of a config that faults (issue 50)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def block_after(heading: str) -> str:
    """The first ```python block after `heading`."""
    rest = README[README.index(heading):]
    return re.search(r"```python\n(.*?)```", rest, re.S).group(1)


def run(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "example.py"  # a file: Triton reads a kernel's source from it
    script.write_text(code)
    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path))


@pytest.mark.gpu
def test_readme_usage_example_runs(tmp_path):
    code = block_after("## Usage") + "\nassert cp.allclose(out, x + y), 'wrong result'\nprint('OK')\n"
    r = run(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.gpu
def test_readme_jax_example_runs_with_the_usage_examples_kernel(tmp_path, jax_gpu):
    usage = block_after("## Usage")
    # The kernel without its autotuning (the JAX example passes BLOCK itself), named as the C++ example names it.
    kernel = ("import triton, triton.language as tl\n" + usage[usage.index("@triton.jit"):usage.index("k = lazytriton")]
              .replace("def add(", "def add_kernel("))
    code = (kernel + block_after("## JAX").replace("def add(", "def add_fn(").replace("jax.jit(add)", "jax.jit(add_fn)")
            + "\nimport numpy as np\nnp.testing.assert_array_equal(np.asarray(out), 2.0)\nprint('OK')\n")
    r = run(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.gpu
def test_readme_online_example_runs_after_the_usage_examples_set_up(tmp_path):
    # The usage example's kernel and data, not its calls (they would tune it on the first call).
    usage = "\n".join(ln for ln in block_after("## Usage").splitlines() if not ln.startswith("k[grid]"))
    code = (usage + "\n" + block_after("### Online tuning") + "\nassert cp.allclose(out, x + y), 'wrong result'\n"
            "assert lazytriton.stats()['online_settled'] == 1 and k.records[-1].extra.get('online')\nprint('OK')\n")
    r = run(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.gpu
def test_readme_faulting_config_example_runs(tmp_path):
    code = (block_after("### A config that faults never takes the program down")
            + "\nfrom lazytriton.runtime import isolation\nassert isolation.stats()['faults'] == 1\nprint('OK')\n")
    r = run(code, tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-2000:] + r.stderr[-4000:]
