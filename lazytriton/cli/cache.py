"""`lazytriton cache ...` subcommands (list, show, clear, push, export, import) and
`lazytriton pretune` (run a program, archive the tuned kernels it used)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from ..cache import USED_KEYS_ENV, Cache, encode_record
from ..cache.remote import RemoteCache, RemoteError
from ..settings import env_flag, file_in_the_way


def add_cache_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `cache` command group to an argparse subparsers object."""
    cache_p = subparsers.add_parser("cache", help="inspect and manage the lazytriton cache")
    cache_p.add_argument("--cache-dir", default=None, type=_cache_dir,
                         help="cache root (default: $LAZYTRITON_CACHE_DIR or ~/.cache/lazytriton)")
    cache_p.set_defaults(func=lambda args: _usage(cache_p))
    # --cache-dir is taken after the subcommand too (SUPPRESS: an absent one
    # leaves the value given before it).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", default=argparse.SUPPRESS, type=_cache_dir, help=argparse.SUPPRESS)
    sub = cache_p.add_subparsers(dest="cache_command", metavar="COMMAND")
    _add = sub.add_parser
    sub.add_parser = lambda *a, **k: _add(*a, parents=[common], **k)  # type: ignore[method-assign]

    remote_help = "the remote cache's entries instead (the server $LAZYTRITON_REMOTE_CACHE names)"
    p = sub.add_parser("list", help="list cached binaries and tuning records")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--remote", action="store_true", help=remote_help)
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", help="show one entry by key (a unique prefix is enough)")
    p.add_argument("key")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--remote", action="store_true", help=remote_help)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("clear", help="remove entries (all, with the built launch stubs; or those of one kernel)")
    p.add_argument("--kernel", default=None, help="only entries of this kernel name (launch stubs, shared by "
                                                  "kernels, stay)")
    p.add_argument("--remote", action="store_true", help=remote_help + ": every host sharing it loses them")
    p.set_defaults(func=cmd_clear)

    p = sub.add_parser("push", help="publish every tuned winner of this cache (record and binary) to the remote "
                                    "cache $LAZYTRITON_REMOTE_CACHE names (e.g. after `cache import` of a pretune "
                                    "archive: seeds a fleet's server)")
    p.add_argument("--kernel", default=None, help="only the winners of this kernel name")
    p.set_defaults(func=cmd_push)

    p = sub.add_parser("export", help="write all valid entries to an archive (.tar.gz)")
    p.add_argument("file")
    p.add_argument("--kernel", default=None, help="only entries of this kernel name")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="verify and install an archive written by `cache export`")
    p.add_argument("file")
    p.set_defaults(func=cmd_import)
    return cache_p


def _cache_dir(value: str) -> str:
    blocker = file_in_the_way(Path(value).expanduser())
    if blocker is not None:  # a file is no cache: refused here, not listed as an empty one
        raise argparse.ArgumentTypeError(f"{value!r} is not a directory ({blocker} is a file)")
    return value


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _open_cache(args: argparse.Namespace) -> Cache:
    # The CLI always looks at the disk, even if LAZYTRITON_CACHE=0 is set for
    # the programs being run.
    return Cache(getattr(args, "cache_dir", None), disk=True)


def _fmt_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _fmt_time(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def config_text(config: Any) -> str:
    """A config (a dict, or Triton's Config) as its values (BM=128, num_warps=4), the options left
    unset (None) left out."""
    values = config.all_kwargs() if hasattr(config, "all_kwargs") else dict(config or {})
    return ", ".join(f"{k}={v}" for k, v in values.items() if v is not None)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _on_remote(args: argparse.Namespace, action) -> Optional[int]:
    """With --remote: action(the remote cache $LAZYTRITON_REMOTE_CACHE names), its exit status
    (a failure to reach it said); None without --remote."""
    if not getattr(args, "remote", False):
        return None
    remote = _open_cache(args).remote
    if remote is None:
        print("error: --remote: no remote cache is set (LAZYTRITON_REMOTE_CACHE=redis://host:port/db lazytriton cache "
              f"{args.cache_command} --remote)", file=sys.stderr)
        return 2
    try:
        return action(remote)
    except RemoteError as exc:
        print(f"error: cannot reach the remote cache {remote.shown}: {exc}", file=sys.stderr)
        return 1


def _print_listing(args: argparse.Namespace, where: str, entries: list, row, header: list[str]) -> int:
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
    elif not entries:
        print(f"{where}\n(empty)")
    else:
        print(where)
        print(_table([row(e) for e in entries], header))
        print(f"{len(entries)} entries, {_fmt_size(sum(e.size for e in entries))}")
    return 0


def _remote_summary(cache: Cache) -> None:
    """One line on the remote tier under `cache list`: where it is, how many entries (or why not)."""
    if cache.remote is None:
        return
    try:
        n = len(cache.remote.entries())
        print(f"remote cache {cache.remote.shown}: {n} entr{'y' if n == 1 else 'ies'} (lazytriton cache list --remote)")
    except RemoteError as exc:
        print(f"remote cache {cache.remote.shown}: cannot reach it ({exc})")


def cmd_list(args: argparse.Namespace) -> int:
    on_remote = _on_remote(args, lambda remote: _print_listing(
        args, f"remote cache: {remote.shown}", remote.entries(),
        lambda e: [e.kind, e.key[:16], e.kernel_name, _fmt_size(e.size), e.device_name or "",
                   config_text(e.winner_config)], ["KIND", "KEY", "KERNEL", "SIZE", "DEVICE", "WINNER"]))
    if on_remote is not None:
        return on_remote
    cache = _open_cache(args)
    _print_listing(args, f"cache: {cache.dir}", cache.entries(),
                   lambda e: [e.kind, e.key[:16], e.kernel_name, _fmt_size(e.size), _fmt_time(e.mtime),
                              e.device_name or "", config_text(e.winner_config)],
                   ["KIND", "KEY", "KERNEL", "SIZE", "MODIFIED", "DEVICE", "WINNER"])
    if not args.json:
        _remote_summary(cache)
    return 0


def _print_record(rec: dict) -> None:
    for field in ("kernel_name", "device_name", "compute_capability", "driver_version", "triton_version",
                  "lazytriton_version", "created", "tune_key_values", "winner", "winner_index"):
        print(f"{field:20} {rec.get(field)}")
    rows = []
    for i, cand in enumerate(rec.get("candidates") or []):
        time_ms = cand.get("time_ms")
        rows.append(["*" if i == rec.get("winner_index") else "", str(i), config_text(cand.get("config")),
                     f"{time_ms:.4f}" if isinstance(time_ms, (int, float)) else "-",
                     (cand.get("compile_key") or "")[:16], str(cand.get("error") or "")])
    if rows:
        print()
        print(_table(rows, ["", "#", "CONFIG", "TIME_MS", "BINARY", "ERROR"]))
    if rec.get("extra"):
        print(f"\nextra: {json.dumps(rec['extra'], sort_keys=True)}")


def _print_binary(binary: dict) -> None:
    print(f"{'name':20} {binary['name']}")
    print(f"{'cubin':20} {binary['cubin_size']} bytes, sha256 {binary['cubin_sha256']}")
    print(f"{'asm':20} {', '.join(binary['asm_names'])}")
    for name, value in sorted(binary["metadata"].items()):
        print(f"  {name:18} {json.dumps(value)}")
    if binary.get("ttir"):
        print(f"\nttir ({binary['ttir'].count(chr(10)) + 1} lines; use --json for the text)")


def _show_remote(args: argparse.Namespace, remote: RemoteCache) -> int:
    try:
        entry = remote.show(args.key)
    except (KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(entry, indent=2))
        return 0 if entry["valid"] else 1
    for field in ("kind", "key", "server", "kernel_name", "size"):
        print(f"{field:20} {entry.get(field)}")
    if not entry["valid"]:
        print(f"INVALID: {entry.get('error')} (a lookup treats it as a miss and removes it)")
        return 1
    print(f"{'written by':20} " + ", ".join(f"{k} {entry['head'].get(k)}" for k in ("triton", "lazytriton", "format")))
    if entry.get("blob"):
        print(f"{'image':20} blob {entry['blob']}")
    if "record" in entry:
        _print_record(entry["record"])
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    on_remote = _on_remote(args, lambda remote: _show_remote(args, remote))
    if on_remote is not None:
        return on_remote
    try:
        entry = _open_cache(args).show(args.key)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(entry, indent=2))
        return 0
    print(f"{'kind':20} {entry['kind']}")
    print(f"{'key':20} {entry['key']}")
    print(f"{'path':20} {entry.get('path') or '(memory)'}")
    if not entry.get("valid"):
        print(f"INVALID: {entry.get('error')}")
        return 1
    if "record" in entry:
        _print_record(entry["record"])
    else:
        _print_binary(entry["binary"])
    return 0


def _clear_remote(args: argparse.Namespace, remote: RemoteCache) -> int:
    removed = remote.clear(args.kernel)
    what = f" of kernel {args.kernel}" if args.kernel else ""
    print(f"removed {removed} remote entr{'y' if removed == 1 else 'ies'}{what} from {remote.shown}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    on_remote = _on_remote(args, lambda remote: _clear_remote(args, remote))
    if on_remote is not None:
        return on_remote
    cache = _open_cache(args)
    removed = cache.clear(args.kernel)
    what = f" of kernel {args.kernel}" if args.kernel else ""
    stubs = ""
    if not args.kernel:
        from ..runtime.native import clear_stubs

        n = clear_stubs(cache.root)
        stubs = f" and {n} launch stub{'' if n == 1 else 's'}"
    print(f"removed {removed} entr{'y' if removed == 1 else 'ies'}{what}{stubs}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    cache = _open_cache(args)
    if cache.remote is None:
        print("error: no remote cache is set (LAZYTRITON_REMOTE_CACHE=redis://host:port/db lazytriton cache push)",
              file=sys.stderr)
        return 2
    pushed = skipped = 0
    for info in cache.entries():
        if info.kind != "record" or (args.kernel and info.kernel_name != args.kernel):
            continue
        rec = cache.load_record(info.key)
        binary = cache.load_binary(rec.winner) if rec is not None else None
        if rec is None or not cache.remote.publish(info.key, rec, encode_record(info.key, rec), binary, rec.winner):
            skipped += 1
        else:
            pushed += 1
    failures = cache.remote.stats["failures"]
    print(f"published {pushed} tuned winner{'' if pushed == 1 else 's'} to {cache.remote.shown}"
          + (f"; {skipped} not (invalid, untuned, adopted from another rank, or refused: see the warnings)"
             if skipped else ""))
    return 1 if failures else 0


def cmd_export(args: argparse.Namespace) -> int:
    try:
        count = _open_cache(args).export(args.file, kernel=args.kernel)
    except OSError as exc:
        print(f"error: cannot write {args.file}: {exc}", file=sys.stderr)
        return 1
    print(f"exported {count} entr{'y' if count == 1 else 'ies'} to {args.file}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    cache = _open_cache(args)
    try:
        count = cache.import_(args.file, disk_only=True)  # this process's memory ends with it
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"imported {count} entr{'y' if count == 1 else 'ies'} into {cache.dir}")
    return 0


# --------------------------------------------------------------------------
# pretune
# --------------------------------------------------------------------------

PRETUNE_HELP = """\
Run a program once (for a training job: its first step) with lazytriton noting
every tuning record it loads or tunes, then write an archive of exactly those
records and their winners' binaries (no losing candidates). Ship the archive to
every node (`lazytriton cache import ARCHIVE`) and no node compiles or tunes
at job start. The nodes must match this one: same GPU model, CUDA driver,
Triton and lazytriton versions (other entries are ignored there, never misused).

  lazytriton pretune -o kernels.tar.gz -- python train.py --steps 1
"""


def add_pretune_command(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("pretune", help="run a program and archive the tuned kernels it used",
                              description=PRETUNE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", required=True, help="the archive to write (.tar.gz)")
    p.add_argument("--cache-dir", default=None,
                   help="cache the program uses (default: $LAZYTRITON_CACHE_DIR or ~/.cache/lazytriton)")
    p.add_argument("program", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(func=cmd_pretune)
    return p


def _used_records(where: Path) -> list[str]:
    keys = []
    for path in sorted(where.glob("*.keys")):  # one file per process of the program
        for line in path.read_text().splitlines():
            kind, _, key = line.partition(" ")
            if kind == "record" and key:
                keys.append(key)
    return list(dict.fromkeys(keys))


def cmd_pretune(args: argparse.Namespace) -> int:
    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    if not program:
        print("error: give the program to run after --, e.g. lazytriton pretune -o k.tar.gz -- python train.py",
              file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.cache_dir:
        env["LAZYTRITON_CACHE_DIR"] = args.cache_dir
    if not env_flag("LAZYTRITON_CACHE", True):
        print("pretune: ignoring LAZYTRITON_CACHE=0: the archive is made from the disk cache", file=sys.stderr)
    env["LAZYTRITON_CACHE"] = "1"
    with tempfile.TemporaryDirectory(prefix="lazytriton-pretune-") as used:
        env[USED_KEYS_ENV] = used
        try:
            rc = subprocess.call(program, env=env)
        except OSError as exc:
            print(f"error: cannot run {program[0]}: {exc}", file=sys.stderr)
            return 127
        if rc != 0:
            print(f"error: the program exited with status {rc}; no archive written", file=sys.stderr)
            return rc if rc > 0 else 1
        records = _used_records(Path(used))
    if not records:
        print("error: the program resolved no tuned kernel through lazytriton; no archive written",
              file=sys.stderr)
        return 1
    cache = Cache(args.cache_dir, disk=True)
    try:
        count = cache.export(args.output, records=records)
    except OSError as exc:
        print(f"error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 1
    if not count:  # every record used lost its winner's binary since
        Path(args.output).unlink(missing_ok=True)
        print(f"error: none of the {len(records)} tuning record(s) the program used could be archived (see the "
              "warnings above); no archive written", file=sys.stderr)
        return 1
    print(f"pretune: the program used {len(records)} tuned kernel specialization(s); wrote {count} "
          f"entr{'y' if count == 1 else 'ies'} to {args.output}")
    print(f"on every node: lazytriton cache import {args.output}")
    return 0
