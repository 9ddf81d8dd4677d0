"""The remote cache tier against a real Redis server (Debian's redis-server, started
here on a free loopback port) and real processes: lazytriton's runtime, real Triton
compiles for sm_90, the recording stand-in driver (tests/fake_cuda), each process
on a cache directory of its own (tests/remote_cache_worker.py). Also the
per-config measurements that outlive an edited config list, without Redis too."""
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lazytriton.bench import redis_server
from lazytriton.cache.remote import Backend

redis = pytest.importorskip("redis", reason="the redis client is not installed (pip install \".[redis]\")")

WORKER = Path(__file__).resolve().parent / "remote_cache_worker.py"

# The kernel's lines stay where they are whatever the config list: its fingerprint (Triton's cache
# key hashes its starting line) and so its binaries' keys are the same in every version of the module.
KERNEL = """import triton
import triton.language as tl
CONFIGS = [{configs}]

@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def k(x, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(x + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)
"""
TWO = 'triton.Config({"B": 64}, num_warps=2), triton.Config({"B": 128}, num_warps=4)'
THREE = TWO + ', triton.Config({"B": 256}, num_warps=4)'
NS = "lazytriton:v1:"


def write_kernel(where: Path, configs: str = TWO) -> None:
    (where / "kern.py").write_text(KERNEL.format(configs=configs))


@pytest.fixture
def server(tmp_path):
    if redis_server.available() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    srv = redis_server.RedisServer(tmp_path / "redis").start()
    yield srv
    srv.stop()


def client(srv) -> "redis.Redis":
    return redis.Redis(port=srv.port, socket_timeout=30)


def keys_of(srv, kind: str) -> list[str]:
    return sorted(k.decode() for k in client(srv).scan_iter(match=f"{NS}{kind}:*"))


class Worker:
    """One worker process; call() sends a command and returns its JSON answer."""

    def __init__(self, tmp_path: Path, fake: Path, name: str, url: str | None, **env: str) -> None:
        self.err_path = tmp_path / f"{name}.stderr"
        full = {**os.environ, "LD_LIBRARY_PATH": str(fake), "TRITON_LIBCUDA_PATH": str(fake),
                "FAKE_CUDA_LOG": str(tmp_path / f"{name}.launches.jsonl"), "FAKE_CUDA_PARAM_SIZES": "k:8,4,8,8",
                "LAZYTRITON_CACHE_DIR": str(tmp_path / f"cache-{name}"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
                "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"),
                "PYTHONDONTWRITEBYTECODE": "1", "LAZYTRITON_REMOTE_CACHE_RETRY_AFTER": "0",
                # Under the suite's load a loopback Redis can be starved past the 0.5 s default;
                # the tests of the timeout set their own.
                "LAZYTRITON_REMOTE_CACHE_TIMEOUT": "10", **env}
        full.pop("LAZYTRITON_REMOTE_CACHE", None)
        if url is not None:
            full["LAZYTRITON_REMOTE_CACHE"] = url
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], env=full, cwd=tmp_path, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        self.ready = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise AssertionError(f"worker exited ({self.proc.returncode}):\n{self.stderr()[-6000:]}")
        return json.loads(line)

    def send(self, n: int) -> None:
        self.proc.stdin.write(f"call kern {n}\n")
        self.proc.stdin.flush()

    def call(self, n: int = 4096) -> dict:
        self.send(n)
        return self._answer()

    def stderr(self) -> str:
        self.err.flush()
        return self.err_path.read_text()

    def close(self) -> str:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(60)
        self.err.close()
        return self.err_path.read_text()


def run_one(tmp_path, fake, name, url, n: int = 4096, **env) -> dict:
    w = Worker(tmp_path, fake, name, url, **env)
    try:
        return w.call(n)
    finally:
        w.close()


def warnings(text: str, pattern: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("WARNING") and re.search(pattern, line))


def test_a_second_host_finds_the_winner_in_redis(tmp_path, fake_driver, server):
    write_kernel(tmp_path)
    first = run_one(tmp_path, fake_driver, "a", server.url)
    assert (first["compiles"], first["tunes"], first["remote"]["published"]) == (2, 1, 1), first
    # What is stored: the record, the winner's binary and its image (once), the configs' times.
    assert [len(keys_of(server, kind)) for kind in ("rec", "bin", "blob", "meas")] == [1, 1, 1, 1]
    ttl = client(server).ttl(keys_of(server, "rec")[0])
    assert 29 * 24 * 3600 < ttl <= 30 * 24 * 3600  # the default expiry, renewed by every hit
    second = run_one(tmp_path, fake_driver, "b", server.url)
    assert (second["compiles"], second["tunes"], second["timed"], second["record_hits"]) == (0, 0, 0, 1), second
    assert second["remote"]["hits"] == 2 and second["remote"]["failures"] == 0, second
    assert second["winner"] == first["winner"]
    # It kept what it found: a third process on its cache directory asks Redis nothing.
    server.stop()
    third = run_one(tmp_path, fake_driver, "b", server.url)
    assert (third["compiles"], third["tunes"], third["record_hits"]) == (0, 0, 1), third
    # (Wrapping the kernel tried to connect, in the background: no call waited.)
    assert third["remote"]["hits"] == third["remote"]["misses"] == 0 and third["remote"]["wait_s"] == 0.0, third


def test_importing_lazytriton_connects_in_the_background(tmp_path, fake_driver, server):
    """The client's import (0.2-0.4 s) and the connection are not on the first call's path:
    importing lazytriton starts them on a thread; wrapping a kernel waits for nothing."""
    write_kernel(tmp_path)
    c = client(server)
    me = c.client_id()

    def others() -> list:
        return [x for x in c.client_list() if int(x["id"]) != me]

    w = Worker(tmp_path, fake_driver, "a", server.url)  # imported lazytriton; no kernel yet
    try:
        deadline = time.monotonic() + 30
        while not others() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(others()) == 1, c.client_list()
        w.proc.stdin.write("wrap kern\n")
        w.proc.stdin.flush()
        assert w._answer()["remote"]["wait_s"] == 0.0
        assert len(others()) == 1  # the same connection: wrapping opened none
        found = w.call()
        assert found["remote"]["failures"] == 0 and found["tunes"] == 1, found
    finally:
        w.close()


def test_an_added_config_is_the_only_one_compiled_and_timed(tmp_path, fake_driver):
    """No Redis: the measurements of the local cache."""
    write_kernel(tmp_path, TWO)
    first = run_one(tmp_path, fake_driver, "a", None)
    assert (first["compiles"], first["timed"], first["measured_before"]) == (2, 2, 0), first
    write_kernel(tmp_path, THREE)
    w = Worker(tmp_path, fake_driver, "a", None)
    second = w.call()
    err = w.close()
    assert (second["compiles"], second["timed"], second["measured_before"], second["record_hits"]) == (1, 1, 2, 0)
    assert "2 of 3 configs were measured before" in err and "(configs 2)" in err, err[-3000:]
    # Chosen among all three (the stand-in driver times every config alike: the first wins); the record
    # says which times were measured before.
    assert second["winner"] == 0
    from lazytriton.cache import Cache
    cache = Cache(tmp_path / "cache-a")
    shown = [cache.show(e.key)["record"] for e in cache.entries() if e.kind == "record"]
    (rec,) = [r for r in shown if len(r["candidates"]) == 3]
    assert [(c.get("measured_before", False), c["time_ms"]) for c in rec["candidates"]] == [
        (True, 1.0), (True, 1.0), (False, 1.0)], rec["candidates"]
    # Its record is the new list's: a third process finds it and does nothing.
    third = run_one(tmp_path, fake_driver, "a", None)
    assert (third["compiles"], third["timed"], third["record_hits"]) == (0, 0, 1), third
    # `cache clear --kernel k` removes the kernel's measured times with its entries.
    measured = tmp_path / "cache-a" / "v1" / "measurements"
    assert len(list(measured.iterdir())) == 1
    r = subprocess.run([sys.executable, "-m", "lazytriton", "cache", "clear", "--kernel", "k"], capture_output=True,
                       text=True, env={**os.environ, "LAZYTRITON_CACHE_DIR": str(tmp_path / "cache-a")}, timeout=120,
                       cwd=tmp_path)  # not the checkout: its lazytriton/ would shadow the installed one
    assert r.returncode == 0 and list(measured.iterdir()) == [], r.stdout + r.stderr


def test_an_added_config_on_another_host_through_redis(tmp_path, fake_driver, server):
    write_kernel(tmp_path, TWO)
    run_one(tmp_path, fake_driver, "a", server.url)
    write_kernel(tmp_path, THREE)
    second = run_one(tmp_path, fake_driver, "b", server.url)  # empty local cache
    # The two measured configs' times come from Redis, the winner's binary too: one compile, one trial.
    assert (second["compiles"], second["timed"], second["measured_before"]) == (1, 1, 2), second
    assert len(keys_of(server, "rec")) == 2 and len(keys_of(server, "meas")) == 1


def test_retune_measures_every_config_again(tmp_path, fake_driver):
    write_kernel(tmp_path, TWO)
    run_one(tmp_path, fake_driver, "a", None)
    again = run_one(tmp_path, fake_driver, "a", None, LAZYTRITON_RETUNE="1")
    assert (again["timed"], again["measured_before"]) == (2, 0), again


def test_redis_restarted_and_down_mid_run(tmp_path, fake_driver, server):
    write_kernel(tmp_path)
    w = Worker(tmp_path, fake_driver, "a", server.url)
    try:
        assert w.call(1024)["remote"]["published"] == 1
        server.restart()  # no persistence: an empty server, and the worker's pooled connection is broken
        r = w.call(2048)
        assert r["remote"]["published"] == 2 and r["remote"]["failures"] == 0, r
        assert len(keys_of(server, "rec")) == 1
        server.stop()
        down = [w.call(3072), w.call(4096)]  # tuned here, nothing published, each call fine
        assert [d["remote"]["published"] for d in down] == [2, 2] and down[1]["remote"]["failures"] >= 2, down
        server.start()
        back = w.call(5120)
        assert back["remote"]["published"] == 3, back
    finally:
        err = w.close()
    assert warnings(err, "is unreachable or slow") == 1, err[-4000:]
    assert "answers again" in err
    assert len(keys_of(server, "rec")) == 1


def test_redis_refusing_writes(tmp_path, fake_driver):
    if redis_server.available() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    with redis_server.RedisServer(tmp_path / "redis", "--maxmemory", "64mb", "--maxmemory-policy",
                                  "noeviction") as srv:
        write_kernel(tmp_path)
        assert run_one(tmp_path, fake_driver, "a", srv.url, n=1024)["remote"]["published"] == 1
        c = client(srv)
        for i in range(32):
            c.set(f"junk:{i}", b"x" * 65536)
        # Full: the memory in use is over maxmemory, and noeviction refuses every write.
        c.config_set("maxmemory", int(c.info("memory")["used_memory"]) // 2)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            c.set("one-more", b"x")
        w = Worker(tmp_path, fake_driver, "b", srv.url)
        try:
            found, tuned, more = w.call(1024), w.call(2048), w.call(3072)
        finally:
            err = w.close()
        # Reads still work on a full server: the record published before it filled is found.
        assert (found["compiles"], found["tunes"], found["record_hits"]) == (0, 0, 1), found
        # Writes are refused: tuned here, kept in the local cache, one warning for all.
        assert (tuned["tunes"], tuned["remote"]["published"]) == (1, 0) and tuned["remote"]["failures"] >= 1, tuned
        assert (more["tunes"], more["remote"]["published"]) == (2, 0), more
        assert more["remote"]["failures"] > tuned["remote"]["failures"], more
        assert warnings(err, "refuses writes") == 1, err[-4000:]
        assert len(keys_of(srv, "rec")) == 1


def _tamper(srv, key: str, data: bytes) -> None:
    client(srv).set(key, data)


def test_corrupted_and_foreign_entries_are_misses(tmp_path, fake_driver, server):
    from lazytriton.cache import decode_record, encode_record
    from lazytriton.cache.remote import tier

    write_kernel(tmp_path)
    sizes = [1024, 2048, 3072, 4096]  # one specialization each; all share the same binaries
    w = Worker(tmp_path, fake_driver, "a", server.url)
    try:
        for n in sizes:
            w.call(n)
    finally:
        w.close()
    recs = keys_of(server, "rec")
    assert len(recs) == 4 and len(keys_of(server, "blob")) == 1
    c = client(server)
    by_n = {}
    for name in recs:
        head, body = tier.open_envelope(c.get(name))
        rec = decode_record(head["key"], body)
        by_n[rec.tune_key_values[-1]] = (name, head, rec)
    # n=1024: garbage under its key.
    _tamper(server, by_n[1024][0], b"not an entry")
    # n=2048: intact, but written for another GPU model (head and record agree, checksums right).
    name, head, rec = by_n[2048]
    rec.device_name = "NVIDIA H100 80GB HBM3"
    _tamper(server, name, tier.envelope({**head, "device_name": rec.device_name}, encode_record(head["key"], rec)))
    # n=3072: intact, written by another Triton.
    name, head, rec = by_n[3072]
    _tamper(server, name, tier.envelope({**head, "triton": "0.0.1"}, encode_record(head["key"], rec)))
    # The image every binary names: one byte flipped.
    blob = keys_of(server, "blob")[0]
    image = bytearray(c.get(blob))
    image[len(image) // 2] ^= 0xFF
    _tamper(server, blob, bytes(image))

    w = Worker(tmp_path, fake_driver, "b", server.url)
    try:
        first = w.call(4096)  # a sound record whose winner's image is corrupt: compiles the winner alone
        rest = [w.call(n) for n in (1024, 2048, 3072)]
    finally:
        err = w.close()
    assert (first["compiles"], first["timed"], first["remote"]["discarded"]) == (1, 0, 1), first
    # The three bad records: misses; every config's time was measured before (Redis), the
    # winner's binary is local by now: no compile, no trial.
    assert [(r["compiles"], r["timed"]) for r in rest] == [(1, 0)] * 3, rest
    assert rest[-1]["remote"]["discarded"] == 4, rest[-1]
    assert warnings(err, "discarding the corrupt") == 1 and warnings(err, "discarding the foreign") == 1, err[-4000:]
    assert "written for device_name 'NVIDIA H100 80GB HBM3'" in err and "triton '0.0.1'" in err
    # Each was published again, intact.
    for name in keys_of(server, "rec"):
        head, body = tier.open_envelope(c.get(name))
        assert decode_record(head["key"], body).device_name == "FAKE sm_90"
    assert tier.open_envelope(c.get(by_n[3072][0]))[0]["triton"] != "0.0.1"
    image = c.get(keys_of(server, "blob")[0])
    import hashlib
    assert hashlib.sha256(image).hexdigest() == keys_of(server, "blob")[0].rsplit(":", 1)[1]


def test_a_slow_redis_costs_one_timeout(tmp_path, fake_driver):
    if redis_server.available() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    with redis_server.RedisServer(tmp_path / "redis", "--enable-debug-command", "yes") as srv:
        write_kernel(tmp_path)
        w = Worker(tmp_path, fake_driver, "a", srv.url, LAZYTRITON_REMOTE_CACHE_TIMEOUT="0.3",
                   LAZYTRITON_REMOTE_CACHE_RETRY_AFTER="600")
        def sleep():
            try:
                redis.Redis(port=srv.port, socket_timeout=60).execute_command("DEBUG", "SLEEP", "30")
            except redis.RedisError:  # the server is stopped at the end of the test
                pass

        sleeper = threading.Thread(target=sleep, daemon=True)
        t0 = time.monotonic()
        sleeper.start()
        time.sleep(0.3)  # the server is asleep
        try:
            r = w.call(1024)
            again = w.call(2048)
        finally:
            err = w.close()
        assert time.monotonic() - t0 < 25, "the worker waited for the sleeping server"
        assert (r["compiles"], r["tunes"]) == (2, 1), r
        # The call waited for one timeout (the connection made in the background when the kernel was
        # wrapped timed out too); every later request in the pause was not made.
        assert 1 <= r["remote"]["failures"] <= 2 and r["remote"]["wait_s"] < 3, r
        assert again["remote"]["failures"] == r["remote"]["failures"], again
        assert again["remote"]["wait_s"] == r["remote"]["wait_s"], again
        assert warnings(err, "is unreachable or slow") == 1, err[-3000:]


def test_many_processes_publish_the_same_key_at_once(tmp_path, fake_driver, server):
    write_kernel(tmp_path)
    workers = [Worker(tmp_path, fake_driver, f"p{i}", server.url) for i in range(4)]
    try:
        for w in workers:  # all ready: the calls start together
            w.send(4096)
        answers = [w._answer() for w in workers]
    finally:
        for w in workers:
            w.close()
    assert all(a["record_hits"] + a["tunes"] == 1 for a in answers), answers
    assert [len(keys_of(server, kind)) for kind in ("rec", "bin", "blob", "meas")] == [1, 1, 1, 1]
    from lazytriton.cache import decode_record
    from lazytriton.cache.remote import tier
    c = client(server)
    for kind in ("rec", "bin", "meas"):
        tier.open_envelope(c.get(keys_of(server, kind)[0]))
    head, body = tier.open_envelope(c.get(keys_of(server, "rec")[0]))
    decode_record(head["key"], body)
    late = run_one(tmp_path, fake_driver, "late", server.url)
    assert (late["compiles"], late["tunes"], late["record_hits"]) == (0, 0, 1), late


def test_size_limit_keeps_large_entries_local(tmp_path, fake_driver, server):
    write_kernel(tmp_path)
    w = Worker(tmp_path, fake_driver, "a", server.url, LAZYTRITON_REMOTE_CACHE_MAX_ENTRY="1000")
    try:
        r = w.call()
    finally:
        err = w.close()
    assert r["remote"]["published"] == 0 and r["remote"]["not_published"] >= 1, r
    assert warnings(err, "more than LAZYTRITON_REMOTE_CACHE_MAX_ENTRY") == 1, err[-3000:]
    assert keys_of(server, "blob") == [] and keys_of(server, "rec") == []


def test_cache_commands_list_show_and_clear_remote_entries(tmp_path, fake_driver, server):
    write_kernel(tmp_path)
    w = Worker(tmp_path, fake_driver, "a", server.url)
    try:
        w.call(1024)
        w.call(2048)
    finally:
        w.close()
    client(server).set(f"{NS}rec:{'ab' * 32}", b"garbage")
    env = {**os.environ, "LAZYTRITON_REMOTE_CACHE": server.url, "LAZYTRITON_CACHE_DIR": str(tmp_path / "cache-a")}

    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "lazytriton", "cache", *args], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
        return r.returncode, r.stdout + r.stderr

    rc, out = cli("list", "--remote", "--json")
    assert rc == 0, out
    listed = json.loads(out)
    kinds = sorted(e["kind"] for e in listed)
    assert kinds == ["binary", "blob", "measurements", "measurements", "record", "record", "record"], listed
    assert {e["kernel_name"] for e in listed if e["kind"] == "record"} == {"k", "<invalid>"}
    rc, out = cli("list")
    assert rc == 0 and f"remote cache {server.url}: 7 entries" in out, out
    rec_key = next(e["key"] for e in listed if e["kind"] == "record" and e["kernel_name"] == "k")
    rc, out = cli("show", rec_key[:12], "--remote")
    assert rc == 0 and "FAKE sm_90" in out and "winner_index" in out, out
    rc, out = cli("show", "abab", "--remote")
    assert rc == 1 and "INVALID" in out, out
    rc, out = cli("clear", "--remote", "--kernel", "k")
    assert rc == 0 and "removed 6 remote entries of kernel k" in out, out
    assert sorted(k.decode() for k in client(server).keys("*")) == [f"{NS}rec:{'ab' * 32}"]
    rc, out = cli("clear", "--remote")
    assert rc == 0 and "removed 1 remote entry" in out, out
    # Seeding a server from a local cache (e.g. one a pretune archive was imported into).
    rc, out = cli("push")
    assert rc == 0 and f"published 2 tuned winners to {server.url}" in out, out
    assert [len(keys_of(server, kind)) for kind in ("rec", "bin", "blob", "meas")] == [2, 1, 1, 0]
    fresh = run_one(tmp_path, fake_driver, "b", server.url, n=2048)
    assert (fresh["compiles"], fresh["tunes"], fresh["record_hits"]) == (0, 0, 1), fresh
    assert (tmp_path / "cache-a" / "v1" / "records").exists() and any((tmp_path / "cache-a" / "v1" / "records").iterdir())
    # A server that is not there: the command says so and fails.
    env["LAZYTRITON_REMOTE_CACHE"] = f"redis://127.0.0.1:{redis_server.free_port()}/0"
    rc, out = cli("list", "--remote")
    assert rc == 1 and "cannot reach the remote cache" in out, out


def test_settings_are_checked(monkeypatch, tmp_path):
    from lazytriton import settings as config
    from lazytriton.cache import Cache

    monkeypatch.setenv("LAZYTRITON_REMOTE_CACHE", "http://example:80")
    with pytest.raises(config.SettingError, match="LAZYTRITON_REMOTE_CACHE='http://example:80'"):
        Cache(tmp_path)
    monkeypatch.setenv("LAZYTRITON_REMOTE_CACHE", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("LAZYTRITON_REMOTE_CACHE_TIMEOUT", "0")
    with pytest.raises(config.SettingError, match="LAZYTRITON_REMOTE_CACHE_TIMEOUT"):
        config.remote_cache_timeout()
    monkeypatch.setenv("LAZYTRITON_REMOTE_CACHE_MAX_ENTRY", "-1")
    with pytest.raises(config.SettingError, match="LAZYTRITON_REMOTE_CACHE_MAX_ENTRY"):
        config.remote_cache_max_entry()
    assert Cache(tmp_path).remote.shown == "redis://127.0.0.1:1/0"


def test_password_is_not_shown():
    from lazytriton.cache.remote import redact
    assert redact("rediss://:s3cret@cache.example:6380/2") == "rediss://:***@cache.example:6380/2"
    assert redact("redis://user:pw@h:1/0") == "redis://user:***@h:1/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"


def test_a_password_protected_server(tmp_path, fake_driver):
    if redis_server.available() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    with redis_server.RedisServer(tmp_path / "redis", "--requirepass", "s3cret") as srv:
        write_kernel(tmp_path)
        wrong = run_one(tmp_path, fake_driver, "a", f"redis://:nope@127.0.0.1:{srv.port}/3")
        assert wrong["remote"]["published"] == 0 and wrong["remote"]["failures"] >= 1, wrong
        assert "nope" not in (tmp_path / "a.stderr").read_text()
        right = run_one(tmp_path, fake_driver, "b", f"redis://:s3cret@127.0.0.1:{srv.port}/3")
        assert right["remote"]["published"] == 1, right
        assert redis.Redis(port=srv.port, password="s3cret", db=3).dbsize() == 4


def test_a_tls_server(tmp_path, fake_driver):
    """rediss:// with the server's CA given as the client takes it (a URL query option)."""
    import shutil

    if redis_server.available() is None or shutil.which("openssl") is None:
        pytest.skip("needs redis-server and openssl")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    tls = redis_server.free_port()
    with redis_server.RedisServer(tmp_path / "redis", "--tls-port", str(tls), "--tls-cert-file", str(cert),
                                  "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                                  "--tls-auth-clients", "no") as srv:
        write_kernel(tmp_path)
        url = f"rediss://127.0.0.1:{tls}/0?ssl_ca_certs={cert}"
        assert run_one(tmp_path, fake_driver, "a", url)["remote"]["published"] == 1
        found = run_one(tmp_path, fake_driver, "b", url)
        assert (found["compiles"], found["tunes"], found["record_hits"]) == (0, 0, 1), found
        assert len(keys_of(srv, "rec")) == 1
        # Plain redis:// to the TLS port: a miss and one warning, never a failed call.
        plain = run_one(tmp_path, fake_driver, "c", f"redis://127.0.0.1:{tls}/0")
        assert plain["tunes"] == 1 and plain["remote"]["failures"] >= 1, plain


def test_without_the_redis_client_the_local_cache_serves(monkeypatch, caplog):
    """LAZYTRITON_REMOTE_CACHE set where the client is not installed: one warning, then misses."""
    from lazytriton.cache.remote import RemoteCache

    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` raises ImportError
    remote = RemoteCache("redis://127.0.0.1:1/0")
    with caplog.at_level("INFO", logger="lazytriton.cache"):
        assert remote.fetch_record("ab" * 32) is None and remote.fetch_binary("ab" * 32) is None
    said = [r for r in caplog.records if "the redis client is not installed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING" and 'pip install "lazytriton[redis]"' in said[0].getMessage()


class DirectoryBackend(Backend):
    """The backend interface over files, as an object store would serve it (a key is an object,
    scan lists by prefix; no expiry): the tier needs nothing Redis alone has."""

    def __init__(self, root: Path) -> None:
        self.root, self.url = root, f"file://{root}"
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / key.replace(":", "_")

    def get(self, key, ttl_s):
        path = self._path(key)
        return path.read_bytes() if path.exists() else None

    def put(self, key, value, ttl_s, *, if_absent=False):
        if if_absent and self._path(key).exists():
            return False
        self._path(key).write_bytes(value)
        return True

    def delete(self, keys):
        gone = [self._path(k) for k in keys if self._path(k).exists()]
        for path in gone:
            path.unlink()
        return len(gone)

    def scan(self, prefix):
        for path in self.root.iterdir():
            key = path.name.replace("_", ":", 3)
            if key.startswith(prefix):
                yield key, path.stat().st_size

def test_the_tier_runs_on_any_backend_of_the_interface(tmp_path, caplog):
    from lazytriton.cache import CompiledBinary, TuningRecord, decode_binary, decode_record, encode_record
    from lazytriton.cache.remote import RemoteCache

    backend = DirectoryBackend(tmp_path / "objects")
    remote = RemoteCache("file:///objects", backend=backend)
    image = bytes(range(256)) * 40
    binary = CompiledBinary(name="k", cubin=image, metadata={"num_warps": 4, "shared": 0}, asm_names=["cubin"])
    rec = TuningRecord(kernel_name="k", winner="cd" * 32, winner_index=1, candidates=[{"config": {"B": 64}},
                       {"config": {"B": 128}}], device_name="NVIDIA H100 80GB HBM3", driver_version=13000)
    rkey = "ab" * 32
    assert remote.publish(rkey, rec, encode_record(rkey, rec), binary, rec.winner)
    # The same image under a second compile key: stored once.
    assert remote.publish_binary("ef" * 32, binary)
    assert sorted(k for k, _ in backend.scan("lazytriton:v1:blob:")) == [
        "lazytriton:v1:blob:" + __import__("hashlib").sha256(image).hexdigest()]
    expect = {"device_name": "NVIDIA H100 80GB HBM3", "driver_version": 13000}
    assert decode_record(rkey, remote.fetch_record(rkey, expect)).winner_index == 1
    assert decode_binary("ef" * 32, remote.fetch_binary("ef" * 32)).cubin == image
    # Asked for by another GPU model: foreign, a miss, removed.
    with caplog.at_level("INFO", logger="lazytriton.cache"):
        assert remote.fetch_record(rkey, {**expect, "device_name": "NVIDIA H200"}) is None
    assert "discarding the foreign record" in caplog.text and remote.fetch_record(rkey, expect) is None
    assert [e.kind for e in remote.entries()] == ["binary", "binary", "blob"]
    assert remote.clear("k") == 3 and remote.entries() == []


def test_measurements_key_and_store(tmp_path):
    """What makes two timings comparable is in the key, the config list is not; documents round-trip
    on disk and in memory, and clear by kernel."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    from lazytriton import TuneOptions
    from lazytriton.cache import Cache, measurements

    @triton.jit
    def kern(x, B: tl.constexpr):
        tl.store(x + tl.arange(0, B), 1.0)

    target = GPUTarget("cuda", 90, 32)
    base = dict(fn=kern, shape_sig={"x": "*fp32:16"}, options={}, target=target, device_name="NVIDIA H100",
                tune_key_values=(4096,), driver_version=13000, tune_options=TuneOptions())
    key = measurements.measure_key(**base)
    assert measurements.measure_key(**base) == key
    for change in ({"device_name": "NVIDIA H200"}, {"driver_version": 12080}, {"tune_key_values": (8192,)},
                   {"tune_options": TuneOptions(target_ms=10)}, {"options": {"num_warps": 8}},
                   {"shape_sig": {"x": "*fp16:16"}}, {"target": GPUTarget("cuda", 100, 32)}):
        assert measurements.measure_key(**{**base, **change}) != key, change
    cfg = triton.Config({"B": 64}, num_warps=2)
    assert measurements.config_id(cfg) == measurements.config_id(triton.Config({"B": 64}, num_warps=2))
    assert measurements.config_id(cfg) != measurements.config_id(triton.Config({"B": 64}, num_warps=4))
    for disk in (True, False):
        cache = Cache(tmp_path / f"c{disk}", disk=disk)
        cid, other = measurements.config_id(cfg), "0" * 64
        measurements.record(cache, key, "kern", {cid: {"config": {"B": 64}, "time_ms": 0.5},
                                                 other: {"time_ms": None}})  # no time: not kept
        assert measurements.lookup(cache, key, "kern", [cid, other]) == {cid: {"config": {"B": 64}, "time_ms": 0.5,
                                                                               "measured": ANY_TIME}}
        assert (tmp_path / f"c{disk}" / "v1" / "measurements").exists() == disk
        assert measurements.clear(cache, "another") == 0 and measurements.clear(cache, "kern") == 1
        assert measurements.lookup(cache, key, "kern", [cid]) == {}


class _AnyTime:
    def __eq__(self, other):
        return isinstance(other, str) and re.match(r"\d{4}-\d\d-\d\dT", other) is not None


ANY_TIME = _AnyTime()
