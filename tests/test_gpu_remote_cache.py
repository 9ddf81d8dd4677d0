"""On a GPU: the remote cache tier (a real redis-server started here) and the
configs measured before. A fresh process with an empty local cache and a warm
Redis compiles nothing and times nothing; a config list with one config added
compiles and times that one alone, with and without Redis."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from lazytriton.bench import redis_server

pytestmark = pytest.mark.gpu

# The kernel's lines stay put whatever the config list (its fingerprint holds its first line).
KERNEL = """import triton
import triton.language as tl
CONFIGS = [{configs}]

@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def scale(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(y + o, tl.load(x + o, mask=o < n) * 3 + 1, mask=o < n)
"""
TWO = 'triton.Config({"B": 256}, num_warps=2), triton.Config({"B": 1024}, num_warps=4)'
THREE = TWO + ', triton.Config({"B": 512}, num_warps=4)'

SCRIPT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    import cupy as cp, triton, lazytriton
    from lazytriton.cache import get_cache
    import kern
    n = 1 << 22
    x = cp.random.random(n).astype(cp.float32)  # fresh random data
    y = cp.full(n, cp.nan, cp.float32)  # poisoned: every element must be written
    k = lazytriton.kernel(kern.scale)
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    k[lambda m: (triton.cdiv(n, m["B"]),)](x, y, n)
    cp.cuda.runtime.deviceSynchronize()
    first_s = time.perf_counter() - t0
    ok = bool(cp.allclose(y, x * 3 + 1))
    remote = get_cache().remote
    print(json.dumps({"stats": lazytriton.stats(), "ok": ok, "first_s": first_s,
                      "winner": k.records[-1].winner_index, "remote": remote.stats if remote else None}))
""")


def run(tmp_path, name, url=None):
    # These tests count compiles and tunes, not the remote's latency: under the suite's -n 14 load a
    # loopback Redis (and this process) can be starved past the 0.5 s default, and a request that
    # times out leaves the remote alone for the rest of the process (tests/test_remote_cache.py
    # tests the timeout itself).
    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(tmp_path / f"cache-{name}"),
           "TRITON_CACHE_DIR": str(tmp_path / f"triton-{name}"), "PYTHONDONTWRITEBYTECODE": "1",
           "LAZYTRITON_REMOTE_CACHE_TIMEOUT": "10"}
    env.pop("LAZYTRITON_REMOTE_CACHE", None)
    if url:
        env["LAZYTRITON_REMOTE_CACHE"] = url
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    out["log"] = r.stderr[-3000:]  # the remote tier's warnings, for the assertions' messages
    return out


@pytest.fixture
def server(tmp_path):
    if redis_server.available() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    pytest.importorskip("redis")
    srv = redis_server.RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


def test_a_fresh_process_on_a_warm_redis_compiles_and_times_nothing(tmp_path, server):
    (tmp_path / "kern.py").write_text(KERNEL.format(configs=TWO))
    a = run(tmp_path, "a", server.url)
    assert a["stats"]["compiles"] == 2 and a["stats"]["tunes"] == 1 and a["remote"]["published"] == 1, (a["stats"], a["remote"], a["log"])
    b = run(tmp_path, "b", server.url)  # empty local caches (lazytriton's and Triton's)
    assert (b["stats"]["compiles"], b["stats"]["tunes"], b["stats"]["bench_launches"]) == (0, 0, 0), \
        (b["stats"], b["remote"], b["log"])
    assert b["stats"]["record_hits"] == 1 and b["remote"]["hits"] == 2 and b["winner"] == a["winner"]


def test_an_added_config_is_compiled_and_timed_alone(tmp_path):
    (tmp_path / "kern.py").write_text(KERNEL.format(configs=TWO))
    run(tmp_path, "a")
    (tmp_path / "kern.py").write_text(KERNEL.format(configs=THREE))
    b = run(tmp_path, "a")  # the same local cache
    st = b["stats"]
    assert (st["timed"], st["measured_before"], st["record_hits"]) == (1, 2, 0), st
    # The new config compiled; the winner, if an old config, was in the cache already.
    assert st["compiles"] == 1, st


def test_an_added_config_on_another_host_through_redis(tmp_path, server):
    (tmp_path / "kern.py").write_text(KERNEL.format(configs=TWO))
    a = run(tmp_path, "a", server.url)
    (tmp_path / "kern.py").write_text(KERNEL.format(configs=THREE))
    b = run(tmp_path, "b", server.url)  # empty local caches
    st = b["stats"]
    # The old configs' times come from Redis (the fastest of them is host a's winner, whose binary a
    # published): the new config is the one compiled and timed.
    assert (st["timed"], st["measured_before"], st["compiles"]) == (1, 2, 1), st
    assert b["winner"] in (a["winner"], 2), (a, b)
