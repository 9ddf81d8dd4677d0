"""One process of tests/test_online.py: calls an autotuned in-place kernel CALLS times through
lazytriton's real runtime (Triton compiles for sm_90; the driver is tests/fake_cuda, whose
$FAKE_CUDA_LAUNCH_MS gives each block size its launch time, so each config has its own time).
Prints one JSON line: which config each call launched (by block size), the online counters, the
tuning records, and how many calls reached Python after the winner was installed.

    LD_LIBRARY_PATH=<fake libcuda dir> python online_worker.py [RANK N PORT]   (a jax.distributed job)

Environment: CALLS (default 16), TUNING (the kernel's tuning=, default unset), SAMPLES
(TuneOptions.online_samples, default 3), AFTER (calls made after, counting Python crossings, default 4),
SHAPES ("4096" or "4096,8192": each call's n, in turn), CAPTURE_CALL (that call's stream reports capturing),
WAIT_COMPILED (after the first call, wait until every candidate compiled), AHEAD (compile_ahead first).
"""
import json
import os
import sys
import time

distributed_job = len(sys.argv) == 4
if distributed_job:
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    rank, n_proc, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n_proc, process_id=rank,
                               initialization_timeout=120)

import logging  # noqa: E402

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s: %(message)s")
for noisy in ("lazytriton.compile", "lazytriton.compile.compiler", "lazytriton.cache"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import _core  # noqa: E402
from lazytriton.model.arrays import DeviceArray  # noqa: E402
from lazytriton.runtime import online  # noqa: E402

WARPS = (1, 2, 4)  # blocks of 32, 64 and 128 threads: the fake driver times launches by block size


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=w) for w in WARPS], key=["n"])
@triton.jit
def bump(x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) + 1, mask=m)


def launched_blocks(log_path: str) -> list[int]:
    try:
        with open(log_path) as f:
            return [json.loads(line)["block"] for line in f if '"bump' in line]
    except FileNotFoundError:
        return []


log_path = os.environ["FAKE_CUDA_LOG"]
k = lazytriton.kernel(bump, tuning=os.environ.get("TUNING") or None,
                      tune_options=lazytriton.TuneOptions(online_samples=int(os.environ.get("SAMPLES", "3"))))
shapes = [int(v) for v in os.environ.get("SHAPES", "4096").split(",")]
x = DeviceArray(0x7F0000000000, "fp32", 4 * max(shapes), (max(shapes),))
capture_call = int(os.environ.get("CAPTURE_CALL", "-1"))
if os.environ.get("AHEAD"):  # every candidate compiled ahead (lazytriton.LazyKernel.compile_ahead)
    k.compile_ahead(x, shapes[0]).result()
if os.environ.get("RESOLVE_FIRST"):  # a caller of resolve() that does not ask again per call (a bundle's add)
    resolved = k.resolve(x, shapes[0], grid=lambda meta: (triton.cdiv(shapes[0], meta["BLOCK"]),), stream=0)
    assert not resolved.this_call_only and resolved.timer is None
compiled_before = lazytriton.stats()["compiles"]
real_is_capturing = _core.is_capturing
blocks = []
for i in range(int(os.environ.get("CALLS", "16"))):
    n = shapes[i % len(shapes)]
    _core.is_capturing = (lambda s: True) if i == capture_call else real_is_capturing
    before = len(launched_blocks(log_path))
    k[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, n, stream=0)
    after = launched_blocks(log_path)
    # Tuned online, every call is one launch (a first call that tunes launches its trials too).
    assert len(after) == before + 1 or k.tuning_mode != "online", f"call {i} launched {len(after) - before} kernels"
    blocks.append(after[-1])
    if i == 0:
        compiles_at_first_call = lazytriton.stats()["compiles"] - compiled_before
    while i == 0 and os.environ.get("WAIT_COMPILED") and any(s.compiling for s in k._online.values()):
        time.sleep(0.02)  # every candidate compiled before the tuning calls: each call's pick is then known
_core.is_capturing = real_is_capturing

crossings = []
original = k._first_call
k._first_call = lambda *a: crossings.append(1) or original(*a)  # the C launcher calls it by name
for _ in range(int(os.environ.get("AFTER", "4"))):
    n = shapes[0]
    k[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, n, stream=0)

st = lazytriton.stats()
print(json.dumps({
    "blocks": blocks, "after_blocks": launched_blocks(log_path)[-int(os.environ.get("AFTER", "4")):] if
    int(os.environ.get("AFTER", "4")) else [], "crossings_after": len(crossings),
    "online": online.counters(), "history": online.history(), "tunes": st["tunes"],
    "record_hits": st["record_hits"], "compiles": st["compiles"], "compiles_at_first_call": compiles_at_first_call,
    "records": [{"winner_index": r.winner_index, "extra": {k: v for k, v in r.extra.items() if k != "launch"},
                 "times": [c["time_ms"] for c in r.candidates]} for r in k.records],
    "warps": list(WARPS)}), flush=True)
if distributed_job:
    jax.distributed.shutdown()
