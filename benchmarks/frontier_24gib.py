"""The three 7B recipes on a 24 GB card, speed for memory (issue 56): each
variant of their committed runs as a point, its process GPU memory (the
run's, beyond CUDA's context: mem_get_info) against its tokens/s, with the
24 GiB line beside. It runs nothing: it reads the runs' JSONs named in
RUNS, and each point keeps its run's file and machine.

    python benchmarks/frontier_24gib.py [--out DIR]

Writes frontier_24gib.json and frontier_24gib.png to --out (default the
folder of the runs) and prints a table."""
import argparse
import json
import os
import statistics

import method

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
FOLDER = "2026-11-30-h200-x2"
GiB = 1 << 30
CARD = 24 * GiB
# recipe: [(the run's JSON in FOLDER, its batch (a benchmark that times
# several) or None, the variants taken from it (None: every one but those
# in skip), the variants skipped)]
RUNS = {
    "generation, batch 1": [("offload_llama-24GiB-last.json", "1", None, ())],
    "LoRA, batch 4": [
        # (torch_uvm's 24 GiB point of this run chose the budget of the weights
        # alone, fixed in dca500d: its point is the next run's)
        ("offload_lora-24GiB-anchors.json", "4", None, ("torch_uvm_bound_24GiB",)),
        ("offload_lora-24GiB-whole.json", "4", ("torch_uvm_bound_24GiB",), ())],
    "full fine-tune, batch 4": [
        ("offload_train-7b-full-anchors.json", None, None, ()),
        ("offload_train-7b-full-8GiB.json", None,
         ("torch_uvm_bound_8GiB_in_backward_host1_nonblocking",), ()),
        ("offload_train-7b-full-first.json", None, ("torchtune_single_device",), ())],
}


# What a variant's name leaves unsaid, in the plot and the table: under
# 24 GiB every weight stays resident, so host_step finds no streamed unit
# to step on the host.
NOTES = {"torch_uvm_bound_24GiB_in_backward_host1_nonblocking":
         "host_step=1, non_blocking=True: none stepped on the host",
         "torch_uvm_bound_8GiB_in_backward_host1_nonblocking": "every unit stepped on the host"}


def label(variant: str, between: str = " ") -> str:
    """The variant's name, with what NOTES says of it after `between`."""
    return f"{variant}{between}({NOTES[variant]})" if variant in NOTES else variant


def point(run: dict, batch) -> tuple:
    """(tokens/s, the run's GPU peak in bytes) of one round of a variant."""
    if batch is not None:       # offload_llama's and offload_lora's batches
        b = run["batches"][batch]
        return b["tokens_per_s"], b["gpu_peak_timed_bytes"]
    return run["tokens_per_step"] / run["s_per_step"], run["process_gpu_memory"]["peak_bytes"]


def points() -> dict:
    """{recipe: [{variant, tokens_per_s (the median of its rounds),
    gpu_bytes (the most of its rounds), run, machine}]}."""
    out = {}
    for recipe, sources in RUNS.items():
        found = []
        for name, batch, only, skip in sources:
            with open(os.path.join(RESULTS, FOLDER, name)) as f:
                data = json.load(f)
            runs = data["runs"]
            if "llama7b" in runs:        # offload_train keeps its runs by scenario
                runs = runs["llama7b"]
            for variant, rounds in runs.items():
                ok = [r for r in rounds if r]
                if variant == "pinned_rate" or not ok or variant in skip or \
                        (only is not None and variant not in only):
                    continue
                measured = [point(r, batch) for r in ok]
                found.append({"variant": variant,
                              "tokens_per_s": statistics.median(t for t, _ in measured),
                              "gpu_bytes": max(g for _, g in measured),
                              "rounds": len(ok), "run": f"{FOLDER}/{name}",
                              "machine": data["machine"]})
        out[recipe] = found
    return out


def plot(found: dict, path: str) -> None:
    plt = method.pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(found), figsize=(6 * len(found), 4.5), squeeze=False)
    for ax, (recipe, pts) in zip(axes[0], found.items()):
        for p in pts:
            mine = p["variant"].startswith("torch_uvm")
            ax.scatter(p["gpu_bytes"] / GiB, p["tokens_per_s"], marker="o" if mine else "s",
                       color="C0" if mine else "C1")
            ax.annotate(label(p["variant"], "\n"), (p["gpu_bytes"] / GiB, p["tokens_per_s"]),
                        fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
        ax.axvline(CARD / GiB, color="k", ls="--", label="24 GiB")
        ax.set_xlabel("process GPU memory beyond CUDA's context, GiB")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"7B {recipe} (circles: torch_uvm)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(RESULTS, FOLDER))
    args = ap.parse_args()
    found = points()
    print("| recipe | variant | tokens/s | GPU memory, GiB | rounds | run |")
    print("|---|---|---|---|---|---|")
    for recipe, pts in found.items():
        for p in sorted(pts, key=lambda p: p["gpu_bytes"]):
            over = " (over 24 GiB)" if p["gpu_bytes"] > CARD else ""
            print(f"| {recipe} | {label(p['variant'])} | {p['tokens_per_s']:.1f} | "
                  f"{p['gpu_bytes'] / GiB:.2f}{over} | {p['rounds']} | {p['run']} |")
    os.makedirs(args.out, exist_ok=True)
    machines = {p["run"]: p["machine"] for pts in found.values() for p in pts}
    with open(os.path.join(args.out, "frontier_24gib.json"), "w") as f:
        json.dump({"machine": next(iter(machines.values())), "machines": machines,
                   "points": found}, f, indent=1)
    plot(found, os.path.join(args.out, "frontier_24gib.png"))


if __name__ == "__main__":
    main()
