"""What the recipes print beside their speed, measured apart from
torch_uvm's books: the GPU memory in use on the card at its peak
(``torch.cuda.mem_get_info``, sampled every 5 ms: this process's, and any
other's on the same card) and this process's peak resident host memory."""
import resource
import threading

import torch

GiB = 1 << 30


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


def report(what: str, gpu_peak: int, bound: int) -> None:
    print(f"{what}: GPU memory in use at its peak {gpu_peak / GiB:.2f} GiB "
          f"({'within' if gpu_peak <= bound else 'ABOVE'} {bound / GiB:.0f} GiB), "
          f"host peak {host_peak() / GiB:.1f} GiB")
