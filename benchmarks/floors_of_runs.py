"""The floors of committed offload_train runs, re-read: for each run with the
host's shared rates measured, its scenario's link least, the least with
each resource at its solo rate all at once, and the least at the rates it
measured together (floors.py), beside its torch_uvm step times.

    python benchmarks/floors_of_runs.py RUN.json ...
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import floors  # noqa: E402
import method  # noqa: E402
import offload_train  # noqa: E402

def main(argv=None) -> None:
    """Prints the table for each run named."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args(argv)
    print("| run | scenario | link's least (bf16 casts among the placements under autocast) "
          "| solo rates at once | rates seen together "
          "(bf16 casts) | torch_uvm s a step |")
    print("|---|---|---|---|---|---|")
    for path in args.runs:
        with open(path) as f:
            found = json.load(f)
        for scenario, runs in found.get("runs", {}).items():
            rates = offload_train.together_rates(runs)
            some = next((r for v, rs in runs.items() if v != "pinned_rate" for r in rs if r),
                        None)
            if not rates or not some or "weights_bytes" not in some:
                continue
            w, b = some["weights_bytes"], offload_train.budget(scenario)
            h2d, d2h = rates["h2d_gbps"] * 1e9, rates["d2h_gbps"] * 1e9
            host = offload_train.host_rate(runs)
            solo = method.least_step_s(w, b, h2d, d2h, 4 * host)["seconds"] if host else None
            together = floors.least_step_together_s(w, b, rates)["seconds"]
            casts = floors.least_step_together_s(
                w, b, rates, ways=method.PLACEMENTS_BF16_CASTS)["seconds"] \
                if scenario in offload_train.AUTOCAST else None
            steps = {v: [round(r["s_per_step"], 3) for r in rs if r and "s_per_step" in r]
                     for v, rs in runs.items() if v.startswith("torch_uvm")}
            print(f"| {path} | {scenario} | "
                  f"{offload_train.least_limit(w, b, h2d, d2h, scenario in offload_train.AUTOCAST)['seconds']:.3f} | "
                  f"{'—' if solo is None else f'{solo:.3f}'} | {together:.3f} ({'—' if casts is None else f'{casts:.3f}'}) | "
                  + "; ".join(f"{v} {s}" for v, s in steps.items()) + " |")


if __name__ == "__main__":
    main()
