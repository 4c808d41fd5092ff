"""The random differential test over many seeds, on a GPU: each seed's
drawn program (tests/python/differential.py) trains offloaded and all
resident in this one process, compared bit for bit.

    python3 scripts/differential.py [--seeds FIRST:END] [--out DIR]

Prints a line per seed (its features, settings, the budget against the
least and the whole model, the most weights' bytes the driver saw on the
GPU, seconds, ok or FAIL) and a last line "N passed, M failed". With --out,
each failing seed's program is written there as repro-<seed>.py (run it
from tests/python). Exits non-zero if any seed failed."""
import argparse
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:300", help="FIRST:END (END excluded)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    first, end = (int(v) for v in args.seeds.split(":"))
    import torch
    import torch_uvm
    torch_uvm.set_enabled_uvm(True)
    from differential import check, load, program
    from offload_helpers import undo_leftover_offloads
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    passed, failed, streamed = 0, [], 0
    for seed in range(first, end):
        source = program(seed)
        settings = load(source)["SETTINGS"]
        features = source.splitlines()[0].split(": ", 1)[1]
        t0 = time.perf_counter()
        try:
            seen = check(source)
            passed += 1
            streamed += seen["streamed"] > 0
            outcome = (f"ok budget {seen['budget']} (least {seen['least']}, whole "
                       f"{seen['whole']}), {seen['streamed']} of {seen['units']} units "
                       f"streamed, weights on the GPU at most {seen['on_gpu']}")
        except AssertionError as e:
            failed.append(seed)
            outcome = "FAIL " + str(e).splitlines()[1].strip()
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, f"repro-{seed}.py"), "w") as f:
                    f.write(source)
                with open(os.path.join(args.out, f"failure-{seed}.txt"), "w") as f:
                    f.write(str(e) + "\n" + traceback.format_exc())
            undo_leftover_offloads()
        print(f"seed {seed}: {features} | mode={settings['mode']} ahead={settings['ahead']} "
              f"in_backward={settings['step_in_backward']} {settings['optimizer']} "
              f"units={settings['units']} | {outcome} | {time.perf_counter() - t0:.2f} s",
              flush=True)
    print(f"seeds whose offload streamed some units: {streamed} of {passed} passed")
    print(f"failing seeds: {failed}" if failed else "no failing seed")
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
