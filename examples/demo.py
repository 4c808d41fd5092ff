"""The torch_uvm demo: a model larger than its GPU budget, run and trained
bit for bit as all on the GPU.

1. Will it fit? What a Llama-architecture 7B takes on a 24 GiB card, to
   generate, to train LoRA adapters and to fine-tune in full, before
   anything is loaded (torch_uvm.estimate).
2. With a GPU: a 512 MiB model under a 128 MiB budget. Its output, then
   three training steps' losses and weights, compared bit for bit with the
   same model all on the GPU; the process's GPU memory measured by the
   driver (torch.cuda.mem_get_info), not by torch_uvm's books.
3. With a GPU: UVM on, in a process of its own (it stays on once on): a
   move to the GPU without a copy.
   Without a GPU: the allocator's policy over host memory (the C++ tests).

    python examples/demo.py        (scripts/demo.sh sets up, then runs it)
"""
import copy
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))          # this checkout's torch_uvm
sys.path.insert(0, os.path.join(HERE, "recipes"))
import torch_uvm  # noqa: E402
from write_llama import config  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30


def will_it_fit(card: str = "24GiB") -> None:
    print(f"1. Will a Llama-architecture 7B fit a {card.replace('GiB', ' GiB')} card? "
          "(torch_uvm.estimate, nothing loaded)")
    for task, batch, seq, what in (("generate", 1, 512, "generate, bf16"),
                                   ("lora", 4, 1024, "LoRA, bf16 base"),
                                   ("full", 4, 1024, "full fine-tune, fp32 + AdamW")):
        try:
            e = torch_uvm.estimate(config("7b", "bfloat16"), task=task, gpu_memory=card,
                                   batch=batch, seq=seq, link_gbps=None)
        except ValueError as err:
            print(f"   {what:<30} does not fit: {err}")
            continue
        whole = e.budget >= e.weights
        print(f"   {what:<30} {'all on the GPU' if whole else 'streamed'}: budget "
              f"{e.budget / GiB:.1f} GiB of {e.weights / GiB:.1f} GiB of weights, process "
              f"{e.gpu_total / GiB:.1f} GiB, host {e.host / GiB:.1f} GiB")
    print("   (python -m torch_uvm estimate CONFIG --task full --gpu-memory 24GiB: any "
          "config.json)\n")


def build_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(32)])  # 32 x 16 MiB


def process_gpu_memory(baseline_free: int) -> float:
    torch.cuda.synchronize()
    return (baseline_free - torch.cuda.mem_get_info()[0]) / MiB


def train(model, optimizer, batches):
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def offloaded(budget: int = 128 * MiB) -> None:
    print(f"2. A 512 MiB model under a {budget // MiB} MiB budget "
          f"({torch.cuda.get_device_name()})")
    model = build_model()                             # on the CPU
    reference = copy.deepcopy(model)                  # the same weights, for all on the GPU
    torch.manual_seed(1)
    x = torch.randn(64, 2048, device="cuda")
    batches = [(torch.randn(64, 2048, device="cuda"), torch.randn(64, 2048, device="cuda"))
               for _ in range(3)]
    baseline = torch.cuda.mem_get_info()[0]           # (the CUDA context exists by now)

    handle = torch_uvm.offload(model, budget=budget)
    with torch.no_grad():
        out = model(x)
    inference = process_gpu_memory(baseline)
    optimizer = handle.stream_optimizer(torch.optim.AdamW(model.parameters(), fused=True))
    losses = train(model, optimizer, batches)
    training = process_gpu_memory(baseline)

    reference.cuda()                                  # all on the GPU, the same steps
    with torch.no_grad():
        want = reference(x)
    want_losses = train(reference, torch.optim.AdamW(reference.parameters(), fused=True), batches)
    same = torch.equal(out, want) and losses == want_losses and all(
        torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters()))
    print(f"   inference: process GPU memory {inference:.0f} MiB (mem_get_info)")
    print(f"   training, AdamW: {training:.0f} MiB; all on the GPU takes 2 GiB "
          "(weights, gradients, two states)")
    print(f"   losses {[round(v, 4) for v in losses]}")
    print(f"   output, losses and weights bit-identical to all on the GPU: {same}\n")
    handle.undo()
    assert same, "not bit-identical to the model all on the GPU"


def uvm_on() -> None:
    torch_uvm.set_enabled_uvm(True)                   # before any CUDA tensor
    x = torch.randn(64 * MiB // 4)                    # 64 MiB, managed, on the CPU
    y = x.to("cuda")                                  # the same memory, now on the GPU
    print(f"3. UVM on: x.to('cuda') of 64 MiB kept its memory: {y.data_ptr() == x.data_ptr()} "
          f"(device {y.device}); PyTorch's allocator is torch_uvm's: "
          f"{torch.cuda.memory_allocated() // MiB} MiB allocated")


def policy_on_the_cpu() -> None:
    print("No CUDA GPU here: torch_uvm needs one to stream or to allocate managed memory.\n"
          "What runs without one is its policy over host memory, the same C++ code the\n"
          "GPU uses, exercised by the C++ tests:")
    build = os.path.join(os.path.dirname(HERE), "build")
    exe = os.path.join(build, "core_tests")
    if not os.path.exists(exe):
        os.system(f"cmake -S {os.path.dirname(build)} -B {build} -G Ninja >/dev/null && "
                  f"cmake --build {build} >/dev/null")
    os.system(f"{exe} --gtest_filter='UnitSchedule.*:Runtimes/AllocatorTest.*/host' "
              "--gtest_brief=0 | grep -E '^\\[ +(OK|FAILED|PASSED) '")


if __name__ == "__main__":
    if sys.argv[1:] == ["--uvm"]:
        uvm_on()
        sys.exit(0)
    will_it_fit()
    if torch.cuda.is_available():
        offloaded()
        sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), "--uvm"]))
    policy_on_the_cpu()
