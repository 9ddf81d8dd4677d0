"""Process A tunes and exits; process B launches the persisted winner with no
compile and no trial launch (the runtime's own counters say so)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, cupy as cp, triton, lazytriton
    sys.path.insert(0, sys.argv[1])
    from kernels.basic import matmul_kernel
    M = N = K = 512
    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((M, K)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((K, N)).astype(np.float16))
    c = cp.empty((M, N), cp.float16)
    k = lazytriton.kernel(matmul_kernel)
    k[lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))](a, b, c, M, N, K, K, 1, N, 1, N, 1)
    cp.cuda.runtime.deviceSynchronize()
    print(json.dumps({"stats": lazytriton.stats(), "sum": float(c.astype(cp.float64).sum()),
                      "winner": k.records[-1].winner_index}))
""")


def run_process(tests_dir, env, cwd):
    # cwd outside the checkout: the child must import the installed package.
    out = subprocess.run([sys.executable, "-c", SCRIPT, tests_dir], env=env, capture_output=True, text=True,
                         timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_compiles_and_tunes_nothing(tmp_path):
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_CACHE_DIR=str(tmp_path / "tcache"))
    tests_dir = os.path.dirname(__file__)
    a = run_process(tests_dir, env, tmp_path)
    assert a["stats"]["compiles"] == 8 and a["stats"]["bench_launches"] > 0
    b = run_process(tests_dir, env, tmp_path)
    assert b["stats"]["compiles"] == 0, b
    assert b["stats"]["bench_launches"] == 0, b
    assert b["stats"]["record_hits"] == 1
    assert b["stats"]["launches"] == 1
    assert b["winner"] == a["winner"]
    assert b["sum"] == a["sum"]
