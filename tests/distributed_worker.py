"""One process of tests/test_distributed.py: joins a jax.distributed job on the
CPU backend and drives lazytriton.distributed's protocol through JAX's real
key-value store. "Tuning" is a stand-in that picks a rank-dependent winner (as
timing noise would), so any disagreement shows; its "binary" names that winner
and its "cache" is a file per key under CACHE (as the runtime persists a record).

    python distributed_worker.py RANK N PORT OUTDIR [MODE [CACHE]]

MODE: scenarios (default: every scenario of one job), kill (the claimant is
killed mid-tune by the test), restart (a job whose ranks may have cached winners).
"""
import json
import logging
import os
import sys
import threading
import time

os.environ["JAX_PLATFORMS"] = "cpu"
import jax  # noqa: E402

rank, n, port, outdir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mode = sys.argv[5] if len(sys.argv) > 5 else "scenarios"
cache_dir = sys.argv[6] if len(sys.argv) > 6 else os.path.join(outdir, f"cache{rank}")
os.makedirs(cache_dir, exist_ok=True)
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=rank,
                           initialization_timeout=60)
from jax._src.distributed import global_state  # noqa: E402

from lazytriton import distributed as ld  # noqa: E402

client = global_state.client
results: dict = {"rank": rank, "pid": os.getpid()}


class Collect(logging.Handler):
    """The lazytriton log lines of one scenario."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


log_lines = Collect()
logging.getLogger("lazytriton").addHandler(log_lines)
logging.getLogger("lazytriton").setLevel(logging.INFO)


def barrier(name):
    client.wait_at_barrier(f"test/{name}", 60_000)


def tuner(name, delay=0.3, hang_after_claim=None, fail=False, key=None, hang_until=None):
    """local(), adopt() and cached() for one scenario, recording what ran; a
    resolved or adopted winner is persisted under `key` in this rank's cache.
    hang_until: the claimant's "tune" lasts until that key is set (another rank's
    doing), not a number of seconds that a loaded machine may stretch."""
    seen = {"local": 0, "adopt": 0, "binaries": []}
    path = os.path.join(cache_dir, f"{key}.json") if key else None

    def local():
        seen["local"] += 1
        if hang_after_claim is not None:
            client.key_value_set(f"test/{name}/claimed", str(rank))  # tell the others to go now
            with open(os.path.join(outdir, f"tuning{rank}"), "w") as f:  # tell the test (it may kill us)
                f.write(str(os.getpid()))
            time.sleep(hang_after_claim)
        if hang_until is not None:
            client.key_value_set(f"test/{name}/claimed", str(rank))
            client.blocking_key_value_get(hang_until, 120_000)
        time.sleep(delay)
        if fail:
            raise RuntimeError(f"rank {rank}: every candidate config failed")
        winner = 1 + rank % 3  # what this process would pick on its own
        record = {"winner_index": winner, "winner": f"{winner:064x}", "created": f"rank{rank}",
                  "candidates": [{"time_ms": 1.0 + i} for i in range(4)]}
        persist(record)
        return winner, record, f"cubin of config {winner}".encode()

    def adopt(record, origin, binary):
        seen["adopt"] += 1
        seen["origin"] = origin
        seen["binaries"].append(binary.decode() if binary else None)
        persist(record)
        return record["winner_index"]

    def cached():
        if path and os.path.exists(path):
            with open(path) as f:
                record = json.load(f)
            seen["cached"] = record["winner_index"]
            return record["winner_index"], record, f"cubin of config {record['winner_index']}".encode()
        return None

    def persist(record):
        if path:
            with open(path, "w") as f:
                json.dump(record, f)

    return seen, local, adopt, cached


def scenario(name, key, agreement, call=True, end_barrier=True, **kw):
    """Every rank (or those with call=True) resolves `key` once; records the outcome."""
    barrier(name)
    log_lines.lines = []
    seen, local, adopt, cached = tuner(name, key=key, **kw)
    before = ld.stats()
    out = {"called": call}
    if call:
        if kw.get("hang_after_claim") is None and kw.get("hang_until") is None and name in WAIT_FOR_CLAIM:
            client.blocking_key_value_get(f"test/{name}/claimed", 60_000)
        t0 = time.monotonic()
        try:
            out["result"] = agreement.resolve("fake_kernel", key, local, adopt, cached)
        except RuntimeError as exc:
            out["raised"] = str(exc)
        out["elapsed"] = time.monotonic() - t0
    after = ld.stats()
    out.update(seen, stats={k: after[k] - before[k] for k in after}, logs=list(log_lines.lines))
    results[name] = out
    if end_barrier:  # not when a rank was killed: a barrier waits for every rank
        barrier(name + "/done")


WAIT_FOR_CLAIM = {"hang", "fail", "fake_clock", "cached_first", "kill"}  # scenarios where one chosen rank claims first


def finish(alive=None):
    """Write this rank's results; leave the job. With `alive` (a rank died: no
    shutdown barrier can pass), rank 0, whose process holds the coordination
    service, waits for the live ranks' results before it goes."""
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    if alive is None:
        barrier("end")
        jax.distributed.shutdown()
        return
    client.key_value_set(f"test/end/{rank}", "1")
    if rank == 0:
        for r in alive:
            client.blocking_key_value_get(f"test/end/{r}", 60_000)
    os._exit(0)


store = ld.JaxStore()

if mode == "kill":
    # The claimant (rank 2) "tunes" for 60 s; the test kills it (SIGKILL) as soon as it has claimed.
    # The others must not wait forever: after 2 s one takes over, all launch its winner.
    agreement = ld.Agreement(store, rank, n, timeout_s=2.0, slice_s=0.5)
    scenario("kill", "b1" * 32, agreement, hang_after_claim=60.0 if rank == 2 else None, end_barrier=False)
    finish(alive=[r for r in range(n) if r != 2])
elif mode == "restart":
    # A job (re)started over the ranks' caches: "tuning" takes 5 s; LATE_RANK starts late.
    late = int(os.environ.get("LATE_RANK", "-1"))
    agreement = ld.Agreement(store, rank, n, timeout_s=30.0, slice_s=0.5)
    barrier("restart")
    if rank == late:
        time.sleep(1.5)
    log_lines.lines = []
    seen, local, adopt, cached = tuner("restart", key="b2" * 32, delay=5.0)
    t0 = time.monotonic()
    results["restart"] = {"result": agreement.resolve("fake_kernel", "b2" * 32, local, adopt, cached),
                          "elapsed": time.monotonic() - t0, **seen, "stats": ld.stats(),
                          "logs": list(log_lines.lines)}
    finish()
else:
    # Agreement is on by default in a jax.distributed job of several processes, off with LAZYTRITON_AGREE=0.
    default = ld.agreement()
    results["default"] = None if default is None else {"rank": default.rank, "processes": default.processes,
                                                       "timeout_s": default.timeout_s,
                                                       "store": type(default.store).__name__}
    os.environ["LAZYTRITON_AGREE"] = "0"
    results["opted_out"] = ld.agreement() is None
    os.environ["LAZYTRITON_AGREE"] = "1"

    quick = ld.Agreement(store, rank, n, timeout_s=30.0, slice_s=0.5)

    # 1. Every rank needs the kernel: one resolves, all launch its winner (binary included).
    scenario("all", "a1" * 32, default)

    # 2. Ranks 0 and 2 never reach the kernel: nobody waits for them.
    scenario("some", "a2" * 32, quick, call=rank in (1, 3))

    # 3. Three threads per process (12 callers): one resolution in the whole job.
    barrier("threads")
    thread_out, thread_seen = [], []
    before = ld.stats()

    def one_thread():
        seen, local, adopt, _ = tuner("threads")
        thread_out.append(quick.resolve("fake_kernel", "a3" * 32, local, adopt))
        thread_seen.append(seen)

    threads = [threading.Thread(target=one_thread) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    after = ld.stats()
    results["threads"] = {"results": thread_out, "local": sum(s["local"] for s in thread_seen),
                          "adopt": sum(s["adopt"] for s in thread_seen),
                          "stats": {k: after[k] - before[k] for k in after}}
    barrier("threads/done")

    # 4. The claimant (rank 2) hangs past the waiters' timeout: one of them takes over, and
    #    every rank, rank 2 too once it is done, launches the taker's winner.
    short = ld.Agreement(store, rank, n, timeout_s=1.5, slice_s=0.5)
    scenario("hang", "a4" * 32, short, hang_after_claim=4.0 if rank == 2 else None)

    # 5. The claimant (rank 1) fails: the waiters learn it at once and resolve on their own.
    scenario("fail", "a5" * 32, quick if rank != 1 else ld.Agreement(store, rank, n, timeout_s=60.0),
             fail=rank == 1, hang_after_claim=0.0 if rank == 1 else None)

    # 6. A deterministic fake clock: each unanswered wait of the first round "lasts" 100 s; the
    #    600 s timeout is reached after exactly 6 waits, in well under a real second per wait.
    #    Nothing here depends on how fast the machine is: the claimant (rank 3) "tunes" until
    #    the taker has published, and the waits of the second round (for the taker's winner)
    #    "last" 1 s each, so that round outlasts the taker's resolution under any load.
    class Clock:
        def __init__(self):
            self.t = 0.0

    class SteppingStore:
        """JAX's store, with the fake clock moved per wait that ends unanswered."""

        def __init__(self, real, clock):
            self.real, self.clock, self.waits = real, clock, 0

        def add(self, key, value):
            return self.real.add(key, value)

        def get(self, key, timeout_s):
            value = self.real.get(key, timeout_s)
            # In the first round nothing can have been published by fake time: the claimant hangs
            # and the taker publishes after its own 600 s. A rank slow to wait (a loaded machine)
            # may find the taker's winner already there in real time; it has not seen it yet.
            if value is not None and self.clock.t >= 600.0:
                return value
            self.waits += 1
            self.clock.t += 100.0 if self.clock.t < 600.0 else 1.0
            return None

    clock = Clock()
    stepping = SteppingStore(store, clock)
    fake = ld.Agreement(stepping, rank, n, timeout_s=600.0, clock=lambda: clock.t, slice_s=0.05)
    took_over = ld.stats()["takeovers"]
    scenario("fake_clock", "a6" * 32, fake, hang_until="test/fake_clock/published" if rank == 3 else None,
             delay=0.0, end_barrier=False)
    if ld.stats()["takeovers"] > took_over:  # the taker's winner is published: the claimant may finish
        client.key_value_set("test/fake_clock/published", str(rank))
    barrier("fake_clock/done")
    results["fake_clock"]["waits"] = stepping.waits
    results["fake_clock"]["clock"] = clock.t

    # 7. A rank that reaches the kernel after the choice was published takes it at once.
    barrier("late")
    seen, local, adopt, cached = tuner("late", key="a7" * 32)
    if rank == 3:
        for r in range(3):
            client.blocking_key_value_get(f"test/late/{r}", 60_000)
        time.sleep(1.0)
    t0 = time.monotonic()
    res = quick.resolve("fake_kernel", "a7" * 32, local, adopt, cached)
    results["late"] = {"elapsed": time.monotonic() - t0, "result": res, **seen}
    if rank != 3:
        client.key_value_set(f"test/late/{rank}", "1")
    barrier("late/done")

    # 8. Rank 0 claims and "tunes" for 3 s; rank 2 has the winner cached (config 3) and publishes
    #    it at once: ranks 1 and 3 launch it without waiting for rank 0, and so does rank 0.
    if rank == 2:
        with open(os.path.join(cache_dir, "a8" * 32 + ".json"), "w") as f:
            json.dump({"winner_index": 3, "winner": f"{3:064x}", "created": "earlier run", "candidates": []}, f)
    scenario("cached_first", "a8" * 32, quick, hang_after_claim=3.0 if rank == 0 else None)

    finish()
