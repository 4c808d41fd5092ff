"""Where a profiled step's threads spent their time, from a Chrome trace that
torch.profiler wrote (`benchmarks/fsdp_offload.py --profile` with
FSDP_TRACE_DIR keeps rank 0's, gzipped):

    python scripts/trace_threads.py TRACE.json[.gz] [...]

For each trace: its span; each of the busiest CPU threads, from its first
event to its last, with the CPU time it spent in CUDA synchronizations; the
median, longest and total time of FSDP2's backward hooks (pre_backward,
post_backward_reduce); the host steps (`Optimizer.step` annotations) on
each thread: their count, their total, and the median gap from one's start
to the next's. Numbers only: what they mean is said in the results' README."""
import argparse
import collections
import gzip
import json
import statistics


def load(path: str) -> list:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]


def summary(events: list) -> dict:
    if not events:
        return {"span_s": 0.0, "threads": [], "backward_hooks": {}, "host_steps": []}
    t0 = min(e["ts"] for e in events)
    span = (max(e["ts"] + e["dur"] for e in events) - t0) / 1e6
    threads = collections.Counter((e.get("pid"), e.get("tid")) for e in events
                                  if e.get("cat") == "cpu_op")
    busiest = []
    for (pid, tid), ops in threads.most_common(3):
        mine = [e for e in events if (e.get("pid"), e.get("tid")) == (pid, tid)]
        busiest.append({
            "tid": tid, "cpu_ops": ops,
            "from_s": (min(e["ts"] for e in mine) - t0) / 1e6,
            "to_s": (max(e["ts"] + e["dur"] for e in mine) - t0) / 1e6,
            "synchronize_s": sum(e["dur"] for e in mine if e.get("cat") == "cuda_runtime"
                                 and "Synchronize" in e["name"]) / 1e6})
    hooks = {}
    for kind in ("FSDP::pre_backward (", "FSDP::post_backward_reduce ("):
        durs = [e["dur"] / 1e6 for e in events
                if e.get("cat") == "user_annotation" and e["name"].startswith(kind)]
        if durs:
            hooks[kind.split("::")[1].rstrip(" (")] = {
                "count": len(durs), "median_s": statistics.median(durs), "max_s": max(durs),
                "total_s": sum(durs)}
    steps = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step"):
            steps[e.get("tid")].append(e)
    host = []
    for tid, es in steps.items():
        es.sort(key=lambda e: e["ts"])
        gaps = [(b["ts"] - a["ts"]) / 1e6 for a, b in zip(es, es[1:])]
        host.append({"tid": tid, "steps": len(es), "total_s": sum(e["dur"] for e in es) / 1e6,
                     "median_s": statistics.median(e["dur"] / 1e6 for e in es),
                     "median_start_to_start_s": statistics.median(gaps) if gaps else None})
    return {"span_s": span, "threads": busiest, "backward_hooks": hooks, "host_steps": host}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    for path in ap.parse_args().traces:
        s = summary(load(path))
        print(f"{path}: {s['span_s']:.3f} s")
        for t in s["threads"]:
            print(f"  thread {t['tid']}: {t['cpu_ops']} CPU ops, {t['from_s']:.3f}-{t['to_s']:.3f} s, "
                  f"{t['synchronize_s']:.3f} s in CUDA synchronizations")
        for name, h in s["backward_hooks"].items():
            print(f"  FSDP2's {name}: {h['count']}, median {1e3 * h['median_s']:.1f} ms, "
                  f"longest {1e3 * h['max_s']:.1f} ms, total {h['total_s']:.3f} s")
        for h in s["host_steps"]:
            gap = h["median_start_to_start_s"]
            print(f"  steps on thread {h['tid']}: {h['steps']}, total {h['total_s']:.3f} s, median "
                  f"{1e3 * h['median_s']:.1f} ms" + (f", one every {1e3 * gap:.1f} ms" if gap else ""))


if __name__ == "__main__":
    main()
