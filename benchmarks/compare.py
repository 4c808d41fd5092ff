"""Prints the change of each ratio between two benchmark result files.

    python benchmarks/compare.py OLD.json NEW.json

Both files are written by benchmarks/method.py's write() (their
"comparisons"). A change whose new spread overlaps the old one is marked as
within noise.
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    if "comparisons" not in data:
        sys.exit(f"{path} has no 'comparisons': it was not written by benchmarks/method.py")
    return data


def changes(old: dict, new: dict):
    """Rows (name, old summary, new summary, relative change of the median,
    within noise) for every comparison in either file."""
    rows = []
    names = list(old["comparisons"]) + [n for n in new["comparisons"] if n not in old["comparisons"]]
    for name in names:
        a, b = old["comparisons"].get(name), new["comparisons"].get(name)
        if a is None or b is None:
            rows.append((name, a, b, None, None))
            continue
        change = b["median"] / a["median"] - 1 if a["median"] else None
        noise = not (b["min"] > a["max"] or b["max"] < a["min"])
        rows.append((name, a, b, change, noise))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    args = ap.parse_args(argv)
    old, new = load(args.old), load(args.new)
    for label, data in (("old", old), ("new", new)):
        m = data.get("machine", {})
        print(f"{label}: {m.get('gpu')}, driver {m.get('driver')}, torch {m.get('torch')}, "
              f"CUDA {m.get('cuda')}, {m.get('date')}")
    print("| comparison | old median (min–max) | new median (min–max) | change | |")
    print("|---|---|---|---|---|")
    fmt = lambda s: "—" if s is None else f"{s['median']:.3g} ({s['min']:.3g}–{s['max']:.3g})"
    for name, a, b, change, noise in changes(old, new):
        if change is None:
            print(f"| {name} | {fmt(a)} | {fmt(b)} | | only in one file |")
            continue
        better = (change < 0) == (b.get("lower_is_better", True))
        note = "within noise" if noise else ("better" if better else "worse")
        print(f"| {name} | {fmt(a)} | {fmt(b)} | {change:+.1%} | {note} |")


if __name__ == "__main__":
    main()
