"""One process of tests/test_remote_cache.py: lazytriton's real runtime (Triton
compiles for sm_90; the driver is the recording stand-in tests/fake_cuda), its
cache in $LAZYTRITON_CACHE_DIR and the remote tier in $LAZYTRITON_REMOTE_CACHE.
Reads commands from stdin, one a line, and answers each with one JSON line:

    call MODULE N   first call of MODULE.k (autotuned, key=["n"]) with n=N (wrapped first if need be)
    wrap MODULE     wrap MODULE.k, call nothing
    quit

An answer says what this process did so far: compiles, tunes, configs timed and
measured before, cached winners used, the remote tier's counters, and how long
the call took.

    LD_LIBRARY_PATH=<fake libcuda dir> python remote_cache_worker.py DIR
"""
import importlib
import json
import logging
import sys
import time

sys.path.insert(0, sys.argv[1])

import triton  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton.cache import get_cache  # noqa: E402
from lazytriton.model.arrays import DeviceArray  # noqa: E402

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
size = 4096
x = DeviceArray(0x7F0000000000, "fp32", size * 4, (size,))
kernels = {}


def answer(**extra):
    st = lazytriton.stats()
    remote = get_cache().remote
    print(json.dumps({**{k: st[k] for k in ("compiles", "tunes", "record_hits", "timed", "measured_before")},
                      "remote": dict(remote.stats) if remote else None, **extra}), flush=True)


answer()  # ready
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "quit":
        break
    assert words[0] in ("call", "wrap"), line
    name = words[1]
    if name not in kernels:
        kernels[name] = lazytriton.kernel(importlib.import_module(name).k, cache=get_cache())
    if words[0] == "wrap":
        answer()
        continue
    n = int(words[2])
    t0 = time.perf_counter()
    kernels[name][lambda meta: (triton.cdiv(n, meta["B"]),)](x, n, stream=0)
    answer(call_s=time.perf_counter() - t0, winner=kernels[name].records[-1].winner_index
           if kernels[name].records else None)
