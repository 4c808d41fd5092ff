"""What the recipes share: the plan within 24 GiB, the model made on the
meta device from its folder, their training steps, timed, and what they
print beside their speed, measured apart from torch_uvm's books: the GPU
memory in use on the card at its peak (``torch.cuda.mem_get_info``,
sampled every 5 ms: this process's, and any other's on the same card) and
this process's peak resident host memory."""
import resource
import threading
import time

import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM

import torch_uvm

GiB = 1 << 30
GPU_MEMORY = 24 * GiB


def plan(folder: str, task: str, would: str, **estimate) -> bool:
    """Prints the estimate of `task` (torch_uvm.estimate's, `estimate` its
    other arguments) with the largest budget that keeps the process within
    GPU_MEMORY (offload's gpu_memory then measures what the process holds
    and chooses its own); returns whether a GPU is here, saying without one
    what it `would` do."""
    gpu = torch.cuda.is_available()
    found = torch_uvm.estimate(folder, task=task, gpu_memory=GPU_MEMORY, dtype="bfloat16",
                               link_gbps="measure" if gpu else None, **estimate)
    print(found.table())
    if not gpu:
        print(f"no GPU here: with one, it would {would} within that budget and print "
              f"tokens/s, the time to the {'first token' if task == 'generate' else 'first step'}"
              f" and the memory it took")
        return False
    return True


def meta_model(folder: str):
    """The folder's model in bf16 on the meta device, for offload(...,
    checkpoint=folder) to read its weights into (buffers such as the rotary
    tables stay real: init_empty_weights makes only the parameters meta)."""
    with init_empty_weights():
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder),
                                                dtype=torch.bfloat16)


class PeakGpuMemory:
    """``with PeakGpuMemory() as m: ...``, then ``m.peak`` (bytes in use)."""

    def __enter__(self):
        self.peak, self._done = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while True:
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            if self._done.wait(0.005):
                return

    def __exit__(self, *_):
        self._done.set()
        self._thread.join()


def host_peak() -> int:
    """This process's peak resident host memory, in bytes (pinned homes too)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def report(what: str, gpu_peak: int, bound: int = GPU_MEMORY) -> None:
    print(f"{what}: GPU memory in use at its peak {gpu_peak / GiB:.2f} GiB "
          f"({'within' if gpu_peak <= bound else 'ABOVE'} {bound / GiB:.0f} GiB), "
          f"host peak {host_peak() / GiB:.1f} GiB")


def train(model, optimizer, batch: int, seq: int, steps: int, start: float) -> list:
    """`steps` steps on random tokens; each step's seconds (the first's from
    `start`: building, offloading and reading the weights included)."""
    times, vocab = [], model.config.vocab_size
    for step in range(steps):
        ids = torch.randint(0, vocab, (batch, seq), device="cuda")
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.4f}", flush=True)
        times.append(time.perf_counter() - (start if step == 0 else t0))
    return times


def print_steps(times: list, batch: int, seq: int, bound) -> None:
    print(f"{batch * seq / min(times[1:] or times):.0f} tokens/s (the fastest step) at batch "
          f"{batch} x {seq} "
          f"({bound.describe()}); {times[0]:.1f} s from start to the first step's end")
