"""Issue 49, a newcomer's third round: settings checked at import, every documented command from the
clone's root, and the small things (each CPU-runnable)."""
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lazytriton
from lazytriton import cli, settings
from lazytriton.model.arrays import DeviceArray

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYTRITON_")}
    env.pop("PYTHONPATH", None)
    return {**env, **extra}


# -- settings: every one checked at import ---------------------------------------------------------

BAD = [("LAZYTRITON_TUNING", "of"), ("LAZYTRITON_CACHE", "2"), ("LAZYTRITON_RETUNE", "maybe"),
       ("LAZYTRITON_FLUSH_L2", "sometimes"), ("LAZYTRITON_STUB_BUILD", "never"), ("LAZYTRITON_CAPTURE_FALLBACK", "x"),
       ("LAZYTRITON_CACHE_LOCKS", "x"), ("LAZYTRITON_CACHE_LOCK_TIMEOUT", "-5"), ("LAZYTRITON_AGREE", "x"),
       ("LAZYTRITON_AGREE_TIMEOUT", "abc"), ("LAZYTRITON_COMPILE_AHEAD", "x"), ("LAZYTRITON_DEVICE", "abc"),
       ("LAZYTRITON_DRIVER", "nvidia"), ("LAZYTRITON_REMOTE_CACHE", "bogus"), ("LAZYTRITON_REMOTE_CACHE_TIMEOUT", "0"),
       ("LAZYTRITON_REMOTE_CACHE_TTL", "-1"), ("LAZYTRITON_REMOTE_CACHE_MAX_ENTRY", "0"),
       ("LAZYTRITON_CACHE_DIR", "/etc/passwd"), ("LAZYTRITON_COMPILE_WORKERS", "-2"),
       ("LAZYTRITON_DEFAULT_ARCH", "hopper")]


@pytest.mark.parametrize("var,bad", BAD, ids=[f"{v}={b}" for v, b in BAD])
def test_every_bad_setting_is_refused_by_the_check_at_import(monkeypatch, var, bad):
    monkeypatch.setenv(var, bad)
    with pytest.raises(settings.SettingError) as info:
        settings.check_environment()
    assert str(info.value).startswith(f"{var}={bad!r} is not a valid setting: it takes "), info.value
    assert "\n" not in str(info.value)


def test_every_setting_read_anywhere_is_checked():
    """Every LAZYTRITON_* name the package or the C++ core reads is a checked setting, a C++ path or
    a name of the harness's (never a typo)."""
    text = "".join(f.read_text() for d in ("lazytriton", "csrc") for f in (ROOT / d).rglob("*")
                   if f.suffix in (".py", ".cc", ".h") and "bench" not in f.parts)
    read = set(re.findall(r"LAZYTRITON_[A-Z0-9_]*[A-Z0-9]", text))
    known = {*settings.CHECKS, *settings._CPP_ONLY, *settings._NOT_SETTINGS}
    assert read - known == set()


def test_a_bad_setting_stops_import_and_the_cli_with_one_line(tmp_path):
    for cmd in ([sys.executable, "-c", "import lazytriton"], [sys.executable, "-m", "lazytriton", "--version"]):
        r = subprocess.run(cmd, env=_env(LAZYTRITON_TUNING="of"), cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode != 0 and r.stderr.strip().splitlines() == [
            "error: LAZYTRITON_TUNING='of' is not a valid setting: it takes 'first_call' (also 1, true, yes, on), "
            "'online' or 'off' (also 0, false, no) "
            "(or unset for the default)"], r.stderr
    # Caught by a caller, it is an exception like any other (a ValueError whose message is the line).
    code = "try:\n import lazytriton\nexcept ValueError as e:\n print('caught', e)\n"
    r = subprocess.run([sys.executable, "-c", code], env=_env(LAZYTRITON_CACHE="2"), cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("caught LAZYTRITON_CACHE='2'") and not r.stderr, r


def test_a_bad_remote_timeout_prints_no_thread_traceback(tmp_path):
    env = _env(LAZYTRITON_REMOTE_CACHE="redis://127.0.0.1:1/0", LAZYTRITON_REMOTE_CACHE_TIMEOUT="abc")
    r = subprocess.run([sys.executable, "-m", "lazytriton", "--help"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "Exception in thread" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == ["error: LAZYTRITON_REMOTE_CACHE_TIMEOUT='abc' is not a valid setting: "
                                             "it takes a number of seconds >= 0 (or unset for the default)"]


def test_a_typo_of_a_settings_name_is_said(monkeypatch, caplog):
    monkeypatch.setenv("LAZYTRITON_TUNNING", "0")
    monkeypatch.setenv("LAZYTRITON_FIELD_STEPS", "3")  # the tests' own: no word
    with caplog.at_level(logging.WARNING, logger="lazytriton"):
        settings.check_environment()
    said = [r.getMessage() for r in caplog.records]
    assert said == ["LAZYTRITON_TUNNING is not a lazytriton setting (ignored): did you mean LAZYTRITON_TUNING?"]


# -- from the clone's root -------------------------------------------------------------------------

def test_python_m_lazytriton_works_from_the_clones_root():
    """The source tree leads sys.path there and has no C++ core: the installed package takes over."""
    for args in (["--version"], ["--include-dir"], ["cache", "list", "--json"]):
        r = subprocess.run([sys.executable, "-m", "lazytriton", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env=_env(LAZYTRITON_CACHE_DIR=str(ROOT / "build" / "no-cache-here")))
        assert r.returncode == 0 and "not built" not in r.stderr, (args, r.stderr)
    code = "import lazytriton, lazytriton._core as c; print(lazytriton.__file__, c.__file__)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=_env())
    assert r.returncode == 0, r.stderr
    init, core = r.stdout.split()
    assert Path(init).parent == Path(core).parent  # one package: the one with the core


def test_test_children_do_not_run_from_the_clones_root():
    """A `python -c` child started from the clone's root has the source tree first on its sys.path."""
    for f in sorted(HERE.glob("test_*.py")):
        s = f.read_text()
        for m in re.finditer(r"\[sys\.executable, \"-c\"", s):
            call = s[m.start():s.find(")\n", m.start())]
            if "import lazytriton" in s and "cwd" not in call:
                raise AssertionError(f"{f.name}: a `python -c` child without cwd=: {call[:100]}")


# -- the small things ------------------------------------------------------------------------------

def _cut_off(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """The command with its stdout's reader gone before it writes (`| head -1` that has read its line)."""
    p = subprocess.Popen([sys.executable, "-m", "lazytriton", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path, env=_env(LAZYTRITON_CACHE_DIR=str(tmp_path / "cache")))
    p.stdout.close()
    err = p.stderr.read()
    p.wait(120)
    return subprocess.CompletedProcess(p.args, p.returncode, "", err)


@pytest.mark.parametrize("args", [["bench", "--dry-run"], ["cache", "list"]], ids=["bench", "cache"])
def test_a_closed_pipe_ends_quietly(tmp_path, args):
    r = _cut_off(args, tmp_path)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode in (0, 141)


def test_a_file_is_no_cache_directory(capsys):
    for argv in (["cache", "--cache-dir", "/etc/passwd", "list"], ["cache", "list", "--cache-dir", "/etc/passwd"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2
        assert "'/etc/passwd' is not a directory" in capsys.readouterr().err


def test_a_kernels_cache_may_be_a_directory(tmp_path):
    from lazytriton.cache import Cache
    from kernels import basic

    k = lazytriton.kernel(basic.add_kernel, cache=str(tmp_path / "c"))
    assert isinstance(k.cache, Cache) and k.cache.root == tmp_path / "c"
    assert lazytriton.kernel(basic.add_kernel, cache=tmp_path / "c").cache is k.cache  # one per directory
    with pytest.raises(ValueError, match=r"kernel add_kernel: cache='/etc/passwd' is not a directory"):
        lazytriton.kernel(basic.add_kernel, cache="/etc/passwd")
    with pytest.raises(TypeError, match="cache takes a lazytriton.cache.Cache or a directory"):
        lazytriton.kernel(basic.add_kernel, cache=5)


def test_a_misspelled_constexpr_is_named():
    from kernels import basic

    k = lazytriton.kernel(basic.add_kernel)
    x = DeviceArray(0x1000, "fp32", 64, (16,))
    for args in ((x, x, x, 16), (x, x, x, 16, 256)):
        with pytest.raises(TypeError, match=r"^kernel add_kernel: unexpected keyword argument 'BLOK' "
                                            r"\(did you mean 'BLOCK'\?\)$"):
            k._bind(args, {"BLOK": 256})


@pytest.mark.parametrize("field,value", [("retime_within", 2), ("retime_within", -0.1), ("target_ms", 0),
                                         ("retime_target_ms", 0), ("target_ms", float("inf"))])
def test_tune_options_out_of_range_are_refused(field, value):
    with pytest.raises(ValueError, match=f"TuneOptions: {field}="):
        lazytriton.TuneOptions(**{field: value})


def test_export_cpp_names_a_path_given_as_a_module(capsys, tmp_path):
    assert cli.main(["export-cpp", "../mod:fn", "--signature", "*fp32"]) == 1
    err = capsys.readouterr().err
    assert "'../mod' is not a module name" in err and "--path .. mod:fn" in err, err
    assert cli.main(["export-cpp", "mod:fn", "--signature", "*fp32", "--path", str(tmp_path / "nonexistent")]) == 1
    assert f"--path {tmp_path / 'nonexistent'}: no such directory" in capsys.readouterr().err


def test_no_compiler_for_a_sync_stub_build_is_one_line(cache_dir, monkeypatch, caplog):
    from lazytriton.model.contract import DTYPE_IDS
    from lazytriton.model.specialize import Shape, Slot
    from lazytriton.runtime import native, stubgen

    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("LAZYTRITON_STUB_BUILD", "sync")
    shape = Shape(("z", "m"), (Slot("ptr", dtype=DTYPE_IDS["fp64"]), Slot("int", int_type="i32")))
    monkeypatch.delitem(native._loaded, f"lt_stub_{shape.digest()}", raising=False)
    with caplog.at_level(logging.WARNING, logger="lazytriton"):
        stub = stubgen.stub_now(shape)
    assert type(stub).__module__ == "lazytriton._generic_stub" or "generic" in type(stub).__name__.lower(), stub
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "\n" not in said[0], said
    assert "cannot run the C++ compiler '/nonexistent/c++'" in said[0] and "table-driven stub" in said[0], said


def test_the_demo_lists_each_config_once_without_unset_options(monkeypatch, capsys, caplog):
    """Two of the demo's configs (its 8 take tens of seconds to compile on a CPU)."""
    import types

    from lazytriton import demo_kernels

    monkeypatch.setattr(demo_kernels, "DEMO_CONFIGS", demo_kernels.DEMO_CONFIGS[3:5])
    monkeypatch.setattr(lazytriton, "gpu_available", lambda: (False, "a test"))
    compile_log = logging.getLogger("lazytriton.compile")
    monkeypatch.setattr(compile_log, "level", compile_log.level)  # the demo quiets it: put it back after
    with caplog.at_level(logging.INFO):
        assert cli._demo(types.SimpleNamespace(size=256)) == 0
    out = capsys.readouterr().out
    listed = [line for line in out.splitlines() if line.strip().startswith("config ")]
    assert len(listed) == 2 and "None" not in out, out
    assert not [r for r in caplog.records if "compiled config" in r.getMessage()]


def test_the_harness_prints_plain_numbers():
    from lazytriton.bench import report

    got = [report._g(v) for v in (1593.7, 159.37, 15.937, 1.5937, 0.15937, 0.000015937, 0, 2e9)]
    assert got == ["1594", "159", "15.9", "1.59", "0.159", "0.0000159", "0", "2000000000"]


def test_every_path_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`((?:lazytriton|csrc|tests|benchmarks|examples|docs|cmake)/[\w./-]*\w)`", text))
    assert named and not sorted(p for p in named if not (ROOT / p).exists())


def test_readmes_test_commands_come_with_its_extras():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    test_extra = project["project"]["optional-dependencies"]["test"]
    assert " -n " in (ROOT / "README.md").read_text() and any(d.startswith("pytest-xdist") for d in test_extra)
    # The suite's end names failures and errors, not every skipped GPU test.
    assert "-ra" not in project["tool"]["pytest"]["ini_options"]["addopts"].split()


# -- the remote tier -------------------------------------------------------------------------------

class _Down:
    """A server that never answers (every request times out)."""

    def __getattr__(self, name):
        from lazytriton.cache.remote import Unavailable

        def fail(*args, **kwargs):
            raise Unavailable("TimeoutError: timed out")
        return fail


def test_the_remote_tier_warns_once_per_process(caplog, monkeypatch):
    """However many caches (kernels given a directory, the CLI's) a process has on one server."""
    from lazytriton.cache.remote import RemoteCache

    monkeypatch.setenv("LAZYTRITON_REMOTE_CACHE_RETRY_AFTER", "0")
    url = "redis://192.0.2.1:6379/5"  # this test's own: what is said is said once per process
    with caplog.at_level(logging.INFO, logger="lazytriton.cache"):
        for tier in (RemoteCache(url, backend=_Down()), RemoteCache(url, backend=_Down())):
            assert tier.fetch_record("ab" * 32) is None and tier.fetch_record("cd" * 32) is None
    said = [r for r in caplog.records if "is unreachable or slow" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "INFO", "INFO", "INFO"], [r.getMessage() for r in said]


def _redis_server():
    from lazytriton.bench import redis_server

    if redis_server.available() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    return redis_server


@pytest.mark.parametrize("password,url_tail,named", [("", "/99", "DB index is out of range"),
                                                     ("s3cret", "/0", "AuthenticationError"),
                                                     ("s3cret", "/0 wrong", "AuthenticationError")],
                         ids=["db-index", "no-password", "wrong-password"])
def test_a_remote_setting_the_server_refuses_is_named(tmp_path, caplog, password, url_tail, named):
    pytest.importorskip("redis")
    from lazytriton.cache.remote import RemoteCache

    redis_server = _redis_server()
    with redis_server.RedisServer(tmp_path / "redis", *(["--requirepass", password] if password else [])) as srv:
        auth = ":nope@" if url_tail.endswith("wrong") else ""
        tier = RemoteCache(f"redis://{auth}127.0.0.1:{srv.port}{url_tail.split()[0]}")
        with caplog.at_level(logging.INFO, logger="lazytriton.cache"):
            assert tier.fetch_record("ab" * 32) is None and tier.fetch_record("cd" * 32) is None
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "refuses this client" in said[0] and named in said[0], said
    assert "unreachable or slow" not in caplog.text and "nope" not in caplog.text
    assert tier.stats["failures"] == 1  # left alone after the first: no retry mends a setting


def test_a_remote_winner_says_where_it_came_from(tmp_path, fake_driver):
    pytest.importorskip("redis")
    from test_remote_cache import run_one, write_kernel

    redis_server = _redis_server()
    with redis_server.RedisServer(tmp_path / "redis") as srv:
        write_kernel(tmp_path)
        assert run_one(tmp_path, fake_driver, "a", srv.url)["remote"]["published"] == 1
        second = run_one(tmp_path, fake_driver, "b", srv.url)
    assert second["record_hits"] == 1 and second["tunes"] == 0, second
    err = (tmp_path / "b.stderr").read_text()
    assert f"using the tuned winner (config {second['winner']}) from the remote cache {srv.url}: " in err, err


BROKEN = """import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"B": 64}), triton.Config({"B": 128})], key=["n"])
@triton.jit
def k(x, n, B: tl.constexpr):
    tl.store(x + tl.arange(0, B), no_such_name)
"""


def test_compile_ahead_of_a_kernel_whose_every_config_fails_raises(tmp_path, cache_dir, monkeypatch):
    from lazytriton.compile.compiler import AllCandidatesFailed
    from lazytriton.compile.targets import target_for

    (tmp_path / "broken_kernel.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    import broken_kernel

    k = lazytriton.kernel(broken_kernel.k)
    x = DeviceArray(0x7F0000000000, "fp32", 4096, (1024,))
    with pytest.raises(AllCandidatesFailed, match=r"kernel k: every candidate config \(2\) failed"):
        k.compile_ahead(x, 1024, target=target_for("sm_90")).result(timeout=300)


def test_a_compile_error_is_printed_once(tmp_path, cache_dir, monkeypatch, caplog):
    """When every config fails, Triton's whole message (its source line and caret) is the error's
    alone, not printed as a warning first (a config that fails beside others that compile says
    it in its warning: tests/test_compile.py)."""
    import logging

    from lazytriton.compile.compiler import AllCandidatesFailed
    from lazytriton.compile.targets import target_for

    (tmp_path / "broken_once.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    import broken_once

    k = lazytriton.kernel(broken_once.k)
    x = DeviceArray(0x7F0000000000, "fp32", 4096, (1024,))
    with caplog.at_level(logging.WARNING, logger="lazytriton"):
        with pytest.raises(AllCandidatesFailed) as err:
            k.compile_ahead(x, 1024, target=target_for("sm_90")).result(timeout=300)
    whole = str(err.value)
    assert "no_such_name" in whole and "^" in whole  # Triton's message, with its caret
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "no_such_name" not in warned, warned
