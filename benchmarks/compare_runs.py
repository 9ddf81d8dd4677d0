"""Side-by-side ratios of two harness runs (results.json of `lazytriton bench`), row by
row, for the sections given (default: launch and chain, the host costs a change to the
launch core would move):

    python benchmarks/compare_runs.py BEFORE/results.json AFTER/results.json [--sections launch,chain]

Prints each row's median in both runs and after/before; rows only in one run are listed
as such. Run both on the same GPU in one session (the samples are per-launch host costs
in microseconds, or per-kernel times: lower is better)."""
import argparse
import json
import statistics
import sys


def medians(path: str, sections: list[str]) -> dict:
    with open(path) as f:
        data = json.load(f)
    out = {}
    for name in sections:
        for row in data.get("sections", {}).get(name, {}).get("rows", []):
            if row.get("samples"):
                out[(name, row["system"])] = statistics.median(row["samples"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--sections", default="launch,chain")
    a = p.parse_args(argv)
    sections = [s for s in a.sections.split(",") if s]
    before, after = medians(a.before, sections), medians(a.after, sections)
    if not before or not after:
        print("no rows with samples in the given sections", file=sys.stderr)
        return 1
    width = max(len(s) for _, s in before.keys() | after.keys())
    for key in sorted(before.keys() | after.keys()):
        b, x = before.get(key), after.get(key)
        if b is None or x is None:
            print(f"{key[0]:8} {key[1]:{width}}  only in {'after' if b is None else 'before'}")
            continue
        print(f"{key[0]:8} {key[1]:{width}}  {b:9.3f} -> {x:9.3f}   x{x / b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
