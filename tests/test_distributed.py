"""Agreement across processes (lazytriton.distributed) with 4 real processes,
`jax.distributed.initialize` on the CPU backend and JAX's real key-value store:
one resolution per kernel specialization, identical winners, no waiting for a
rank that never reaches the kernel, timeouts and failures honoured. The
scenarios are in distributed_worker.py; each test checks one of them."""
import json
import socket
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


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """{rank: results} of one 4-process job running every scenario."""
    out = tmp_path_factory.mktemp("agree")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(N), str(port), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out)
             for r in range(N)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=180)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r][-4000:]}"
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(N)}


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


def test_hung_claimant_times_out_and_waiters_tune_locally(job):
    runs = {r: job[r]["hang"] for r in range(N)}
    assert runs[2]["local"] == 1 and runs[2]["result"] == 3 and runs[2]["elapsed"] > 4
    for r in (0, 1, 3):
        run = runs[r]
        assert run["local"] == 1 and run["adopt"] == 0 and run["stats"]["timeouts"] == 1
        assert run["result"] == 1 + r % 3  # its own winner, said in a warning
        assert 1.5 <= run["elapsed"] < 4, run["elapsed"]  # the 1.5 s timeout, not the 4 s hang
        assert any(line.startswith("WARNING") and "no winner from rank 2" in line and "after 2 s" in line
                   for line in run["logs"]), run["logs"]


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
    assert runs[3]["local"] == 1
    for r in (0, 1, 2):
        run = runs[r]
        # 600 s of fake time = exactly 6 unanswered waits of "100 s" each.
        assert run["waits"] == 6 and run["clock"] == 600.0
        assert sum("still waiting" in line for line in run["logs"]) == 6
        assert any("after 600 s" in line for line in run["logs"])
        assert run["stats"]["timeouts"] == 1 and run["local"] == 1
        assert run["elapsed"] < 2.5  # real time: 6 x 0.05 s waits + the stand-in tuning


class MemoryStore:
    """A dict with the Store methods (single process): for the unit checks below."""

    def __init__(self):
        self.d = {}

    def claim(self, key, value):
        return self.d.setdefault(key, value) == value

    def set(self, key, value):
        self.d[key] = value

    def get(self, key, timeout_s):
        return self.d.get(key)


def test_store_failure_falls_back_to_local(caplog):
    class Broken(MemoryStore):
        def claim(self, key, value):
            raise ConnectionError("coordination service unavailable")

    before = ld.stats()["store_errors"]
    with caplog.at_level("WARNING", logger="lazytriton"):
        out = ld.agree(Broken(), "b" * 64, "k", lambda: ("mine", {}), lambda rec, o: "theirs", rank=0)
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
        # Another process published first: this one adopts it.
        store.claim(ld.PREFIX + "d" * 64 + "/claim", json.dumps({"rank": 0, "host": "h0", "pid": 7}))
        store.set(ld.PREFIX + "d" * 64 + "/winner", json.dumps({"record": rec, "by": {"rank": 0, "host": "h0",
                                                                                        "pid": 7}}))
        got = a.resolve("k", "d" * 64, lambda: pytest.fail("must not tune"), lambda r, o: (r, o))
        assert got == (rec, {"rank": 0, "host": "h0", "pid": 7})
    finally:
        ld.use(None)
    assert ld.agreement() is None
    prov = ld.provenance(rec, {"rank": 0, "host": "h0", "pid": 7}, "e" * 64)
    assert prov["from_rank"] == 0 and prov["winner_index"] == 2 and prov["times_ms"] == [1.5]
    assert prov["their_compile_key"] == "c" * 64  # differs from this process's compile key
    assert "their_compile_key" not in ld.provenance(rec, {}, "c" * 64)
