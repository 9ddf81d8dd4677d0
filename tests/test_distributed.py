"""Agreement across processes (lazytriton.distributed) with 4 real processes,
`jax.distributed.initialize` on the CPU backend and JAX's real key-value store:
one resolution per kernel specialization, identical winners (binary included),
no waiting for a rank that never reaches the kernel; faults: a claimant that
hangs or is killed mid-tune (one waiter takes over, every rank still launches
one winner), a claimant that fails, a rank that arrives late or restarts with
an empty cache (it takes the published or persisted choice without waiting).
The scenarios are in distributed_worker.py; each test checks one of them."""
import json
import os
import shutil
import signal
import socket
import time
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from lazytriton import distributed as ld  # noqa: E402

N = 4
WORKER = Path(__file__).resolve().parent / "distributed_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(out, port, mode="scenarios", caches=None, env=None, ranks=range(N)):
    return [subprocess.Popen([sys.executable, str(WORKER), str(r), str(N), str(port), str(out), mode]
                             + ([str(caches[r])] if caches else []),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out,
                             env={**os.environ, **(env or {})})
            for r in ranks]


def collect(out, procs, ranks=range(N), timeout=180) -> dict:
    """{rank: results} once the processes ended; a rank that failed fails the test with its log."""
    logs = {}
    try:
        for r, p in zip(ranks, procs):
            logs[r] = p.communicate(timeout=timeout)[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, p in zip(ranks, procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r][-4000:]}"
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in ranks}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """{rank: results} of one 4-process job running every scenario."""
    out = tmp_path_factory.mktemp("agree")
    return collect(out, start(out, free_port()))


def test_on_by_default_in_a_multi_process_job_and_opt_out(job):
    for r, res in job.items():
        assert res["default"] == {"rank": r, "processes": N, "timeout_s": ld.DEFAULT_TIMEOUT_S, "store": "JaxStore"}
        assert res["opted_out"] is True  # LAZYTRITON_AGREE=0


def test_single_process_has_no_agreement():
    # This pytest process never initialized jax.distributed.
    assert ld.agreement() is None


def test_one_resolution_and_one_winner_for_all(job):
    runs = [job[r]["all"] for r in range(N)]
    tuners = [r for r in range(N) if runs[r]["local"] == 1]
    assert len(tuners) == 1, runs
    tuner = tuners[0]
    assert {runs[r]["result"] for r in range(N)} == {1 + tuner % 3}  # the tuner's own pick, everywhere
    for r in range(N):
        if r == tuner:
            assert runs[r]["stats"]["resolved_here"] == 1 and runs[r]["adopt"] == 0
            assert any(f"rank {r} resolves specialization" in line for line in runs[r]["logs"])
        else:
            assert runs[r]["adopt"] == 1 and runs[r]["local"] == 0 and runs[r]["stats"]["received"] == 1
            assert runs[r]["origin"]["rank"] == tuner
            assert runs[r]["binaries"] == [f"cubin of config {1 + tuner % 3}"]  # came with the choice
            assert any(f"waits for rank {tuner}" in line for line in runs[r]["logs"])
            assert any(f"the winner of rank {tuner}" in line for line in runs[r]["logs"])


def test_ranks_that_never_reach_the_kernel_are_not_waited_for(job):
    runs = {r: job[r]["some"] for r in range(N)}
    assert not runs[0]["called"] and not runs[2]["called"]
    callers = [runs[1], runs[3]]
    assert sorted(c["local"] for c in callers) == [0, 1]
    assert callers[0]["result"] == callers[1]["result"]
    assert all(c["elapsed"] < 10 for c in callers)


def test_threads_of_every_process_resolve_once(job):
    runs = [job[r]["threads"] for r in range(N)]
    assert sum(t["local"] for t in runs) == 1
    assert sum(t["adopt"] for t in runs) == 3 * N - 1
    assert len({w for t in runs for w in t["results"]}) == 1 and all(len(t["results"]) == 3 for t in runs)


def test_hung_claimant_one_waiter_takes_over_and_all_agree(job):
    runs = {r: job[r]["hang"] for r in range(N)}
    takers = [r for r in (0, 1, 3) if runs[r]["stats"]["takeovers"] == 1]
    assert len(takers) == 1, runs
    taker = takers[0]
    assert {runs[r]["result"] for r in range(N)} == {1 + taker % 3}  # the taker's winner everywhere
    for r in (0, 1, 3):
        run = runs[r]
        assert run["stats"]["timeouts"] == 1
        assert 1.5 <= run["elapsed"] < 4, run["elapsed"]  # the 1.5 s timeout (+ the taker's 0.3 s), not the hang
        assert any(line.startswith("WARNING") and "no winner from rank 2" in line and "after 2 s" in line
                   for line in run["logs"]), run["logs"]
        if r != taker:
            assert run["local"] == 0 and run["adopt"] == 1 and run["origin"]["rank"] == taker
            assert any(f"rank {taker}" in line and "took over" in line for line in run["logs"]), run["logs"]
    # The hung claimant finished later: its winner was refused, it launches the taker's.
    assert runs[2]["local"] == 1 and runs[2]["elapsed"] > 4 and runs[2]["stats"]["superseded"] == 1
    assert runs[2]["adopt"] == 1 and runs[2]["origin"]["rank"] == taker


def test_failed_claimant_releases_waiters_at_once(job):
    runs = {r: job[r]["fail"] for r in range(N)}
    assert "every candidate config failed" in runs[1]["raised"]
    for r in (0, 2, 3):
        run = runs[r]
        assert run["stats"]["claimant_failed"] == 1 and run["local"] == 1 and run["result"] == 1 + r % 3
        assert run["elapsed"] < 10  # not the 30 s timeout
        assert any("could not resolve it" in line and "every candidate config failed" in line
                   for line in run["logs"])


def test_timeout_measured_with_a_fake_clock(job):
    runs = {r: job[r]["fake_clock"] for r in range(N)}
    assert runs[3]["local"] == 1 and runs[3]["stats"]["superseded"] == 1  # published after the taker
    takers = [r for r in (0, 1, 2) if runs[r]["stats"]["takeovers"] == 1]
    assert len(takers) == 1
    assert {runs[r]["result"] for r in range(N)} == {1 + takers[0] % 3}
    for r in (0, 1, 2):
        run = runs[r]
        # 600 s of fake time = exactly 6 unanswered waits of "100 s" each, then a takeover
        # whose winner arrives within the next round (its waits "last" 1 s: < 600 more).
        assert run["waits"] == 6 if r == takers[0] else 6 <= run["waits"] < 606, (r, run["waits"])
        assert 600.0 <= run["clock"] < 1200.0, run["clock"]
        assert sum("still waiting" in line for line in run["logs"]) >= 6
        assert any("after 600 s" in line for line in run["logs"])
        assert run["stats"]["timeouts"] == 1 and run["local"] == (r == takers[0])
        # Real time: 0.05 s waits and the stand-in tuning, not the 600 s the clock says (loose:
        # a machine under load stretches every wait).
        assert run["elapsed"] < 60


def test_late_rank_takes_the_published_choice_at_once(job):
    runs = {r: job[r]["late"] for r in range(N)}
    assert sum(runs[r]["local"] for r in range(N)) == 1
    assert len({runs[r]["result"] for r in range(N)}) == 1
    assert runs[3]["local"] == 0 and runs[3]["adopt"] == 1 and runs[3]["elapsed"] < 0.5, runs[3]


def test_cached_winner_is_published_without_waiting_for_the_claimant(job):
    runs = {r: job[r]["cached_first"] for r in range(N)}
    assert {runs[r]["result"] for r in range(N)} == {3}  # rank 2's cached winner
    assert runs[2]["cached"] == 3 and runs[2]["local"] == 0 and runs[2]["stats"]["published_cached"] == 1
    for r in (1, 3):
        assert runs[r]["local"] == 0 and runs[r]["adopt"] == 1 and runs[r]["origin"]["rank"] == 2
        assert runs[r]["elapsed"] < 2, runs[r]["elapsed"]  # not rank 0's 3 s tune
    assert runs[0]["local"] == 1 and runs[0]["stats"]["superseded"] == 1 and runs[0]["origin"]["rank"] == 2


def test_claimant_killed_mid_tune(tmp_path):
    """Rank 2 claims and is SIGKILLed while it "tunes": after the 2 s timeout one
    of the others takes over, and every live rank launches the taker's winner."""
    procs = start(tmp_path, free_port(), "kill")
    marker = tmp_path / "tuning2"
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and procs[2].poll() is None:
        time.sleep(0.05)
    assert marker.exists(), "rank 2 never claimed"
    time.sleep(0.2)
    os.kill(procs[2].pid, signal.SIGKILL)
    procs[2].wait(10)
    live = [0, 1, 3]
    res = collect(tmp_path, [procs[r] for r in live], live)
    runs = {r: res[r]["kill"] for r in live}
    takers = [r for r in live if runs[r]["stats"]["takeovers"] == 1]
    assert len(takers) == 1, runs
    assert {runs[r]["result"] for r in live} == {1 + takers[0] % 3}
    for r in live:
        assert runs[r]["stats"]["timeouts"] == 1 and 2 <= runs[r]["elapsed"] < 10, runs[r]
        assert runs[r]["local"] == (r == takers[0]) and runs[r]["adopt"] == (r != takers[0])


def test_restarted_rank_takes_the_persisted_choice(tmp_path):
    """A job agrees (fresh caches); it is restarted (new coordination service) with
    rank 3 on a fresh host (empty cache) that comes up 1.5 s late: the others publish
    the persisted winner at once, rank 3 launches it without waiting or tuning."""
    caches = [tmp_path / f"cache{r}" for r in range(N)]
    first = collect(tmp_path, start(tmp_path, free_port(), "restart", caches))
    chosen = {first[r]["restart"]["result"] for r in range(N)}
    assert len(chosen) == 1
    for f in caches[3].iterdir():
        f.unlink()
    again = collect(tmp_path, start(tmp_path, free_port(), "restart", caches, env={"LATE_RANK": "3"}))
    runs = {r: again[r]["restart"] for r in range(N)}
    assert {runs[r]["result"] for r in range(N)} == chosen
    assert all(runs[r]["local"] == 0 for r in range(N)), runs  # nobody tunes again: 5 s each
    assert sum(runs[r]["stats"]["published_cached"] for r in range(3)) == 1
    assert runs[3]["adopt"] == 1 and runs[3]["elapsed"] < 0.5, runs[3]


class MemoryStore:
    """A dict with the Store methods (single process): for the unit checks below."""

    def __init__(self):
        self.d = {}

    def add(self, key, value):
        return None if self.d.setdefault(key, value) is value else self.d[key]

    def get(self, key, timeout_s):
        return self.d.get(key)


def test_store_failure_falls_back_to_local(caplog):
    class Broken(MemoryStore):
        def add(self, key, value):
            raise ConnectionError("coordination service unavailable")

    before = ld.stats()["store_errors"]
    with caplog.at_level("WARNING", logger="lazytriton"):
        out = ld.agree(Broken(), "b" * 64, "k", lambda: ("mine", {}, None), lambda rec, o, b: "theirs", rank=0)
    assert out == "mine" and ld.stats()["store_errors"] == before + 1
    assert "kernel k: the key-value store failed" in caplog.text


def test_explicit_store_hook_and_provenance(monkeypatch):
    monkeypatch.delenv("LAZYTRITON_AGREE", raising=False)
    store = MemoryStore()
    ld.use(store, rank=1, processes=2, timeout_s=5)
    try:
        a = ld.agreement()
        assert a.store is store and (a.rank, a.processes, a.timeout_s) == (1, 2, 5)
        monkeypatch.setenv("LAZYTRITON_AGREE", "0")
        assert ld.agreement() is None
        monkeypatch.setenv("LAZYTRITON_AGREE", "1")
        rec = {"winner_index": 2, "winner": "c" * 64, "created": "then", "candidates": [{"time_ms": 1.5}]}
        # Another process (rank 0, same store) resolved it first: this one adopts it, binary included.
        rank0 = ld.Agreement(store, 0, 2)
        assert rank0.resolve("k", "d" * 64, lambda: ("r0", rec, b"\x00cubin\n"), lambda *x: pytest.fail()) == "r0"
        got = a.resolve("k", "d" * 64, lambda: pytest.fail("must not tune"), lambda r, o, b: (r, o, b))
        assert got[0] == rec and got[1]["rank"] == 0 and got[2] == b"\x00cubin\n"
    finally:
        ld.use(None)
    assert ld.agreement() is None
    prov = ld.provenance(rec, {"rank": 0, "host": "h0", "pid": 7}, "e" * 64)
    assert prov["from_rank"] == 0 and prov["winner_index"] == 2 and prov["times_ms"] == [1.5]
    assert prov["their_compile_key"] == "c" * 64  # differs from this process's compile key
    assert "their_compile_key" not in ld.provenance(rec, {}, "c" * 64)


def test_first_published_winner_is_launched_by_a_later_resolver():
    """Two resolvers of one key (a slow claimant and a taker): the second to
    publish launches the first one's winner; a bigger binary than MAX_BINARY is not sent."""
    store = MemoryStore()
    big = b"x" * (ld.MAX_BINARY + 1)
    first = ld.agree(store, "f" * 64, "k", lambda: ("one", {"winner_index": 1}, big), lambda *x: pytest.fail(),
                     rank=0)
    assert first == "one"
    # A second claimant (store-wise: a takeover) resolves config 2 and is superseded by config 1.
    second = ld.agree(store, "f" * 64, "k", lambda: pytest.fail("a waiter"), lambda r, o, b: (r, b), rank=1,
                      cached=lambda: ("two", {"winner_index": 2}, b"small"))
    assert second == ({"winner_index": 1}, None)


RUNTIME_WORKER = Path(__file__).resolve().parent / "distributed_runtime_worker.py"


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    """tests/fake_cuda/fake_cuda.c built as libcuda.so.1 (launches recorded, timings stand-ins)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("fake-cuda")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(d / "libcuda.so.1"),
                    str(Path(__file__).resolve().parent / "fake_cuda" / "fake_cuda.c")], check=True)
    return d


def runtime_job(tmp_path, fake, n=2, delay: dict | None = None) -> list[dict]:
    port, procs = free_port(), []
    for r in range(n):
        env = {**os.environ, "LD_LIBRARY_PATH": str(fake), "TRITON_LIBCUDA_PATH": str(fake),
               "FAKE_CUDA_LOG": str(tmp_path / f"launches{r}.jsonl"), "FAKE_CUDA_PARAM_SIZES": "add:8,8,8,4,8,8",
               "LAZYTRITON_CACHE_DIR": str(tmp_path / f"cache{r}"), "TRITON_CACHE_DIR": str(tmp_path / f"triton{r}"),
               "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"),
               "DELAY_S": str((delay or {}).get(r, 0))}
        procs.append(subprocess.Popen([sys.executable, str(RUNTIME_WORKER), str(r), str(n), str(port)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out[-4000:]}"
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def test_runtime_ranks_launch_the_tuners_binary_without_compiling(tmp_path, fake_libcuda):
    """lazytriton's runtime in 2 processes (real Triton compiles for sm_90, the fake
    driver): one compiles and tunes; the other receives the winner's binary with the
    choice and launches it, compiling nothing. Then the job restarts with that rank's
    cache emptied (a new host, up 1 s late): the tuner's cached winner is published,
    nobody compiles."""
    res = runtime_job(tmp_path, fake_libcuda)
    tuner = next(r for r in res if r["agreement"]["resolved_here"] == 1)
    other = next(r for r in res if r is not tuner)
    assert tuner["compiles"] == 3 and tuner["tunes"] == 1
    assert other["agreement"]["received"] == 1 and other["compiles"] == 0 and other["tunes"] == 0, other
    assert other["winner"] == tuner["winner"] and other["agreed"]["from_rank"] == tuner["rank"]
    def launches(r):
        return [json.loads(line) for line in (tmp_path / f"launches{r}.jsonl").read_text().splitlines()]

    received, tuned = launches(other["rank"]), launches(tuner["rank"])
    assert len(received) == 1 and received[0]["grid"] == tuned[-1]["grid"]  # the same config, launched once
    new = other["rank"]  # its host is replaced: empty caches, up 1 s late
    shutil.rmtree(tmp_path / f"cache{new}")
    shutil.rmtree(tmp_path / f"triton{new}", ignore_errors=True)
    again = runtime_job(tmp_path, fake_libcuda, delay={new: 1.0})
    assert all(r["compiles"] == 0 and r["tunes"] == 0 for r in again), again
    old = tuner["rank"]
    assert again[old]["record_hits"] == 1 and again[old]["agreement"]["published_cached"] == 1
    assert again[new]["agreement"]["received"] == 1 and again[new]["winner"] == tuner["winner"]
