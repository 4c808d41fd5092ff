"""A GAN: a generator and a discriminator, each offloaded with a budget of
its own (24 MiB each, for 44 MiB of weights each), each with its own
streamed optimizer.

Each step trains the discriminator on real samples and on the generator's
samples, ``detach()``-ed so that its backward stops at them; then the
generator, through the discriminator, which is frozen with
``requires_grad_(False)`` for that step (it needs its weights in backward,
but no gradients) and unfrozen after. The generator's forward runs before
the discriminator's step and its backward after it: the two offloads stream
interleaved, each within its own share.

    python examples/training/gan_two_optimizers.py
"""
import _common
import torch
import torch.nn.functional as F

import torch_uvm

MiB = _common.MiB
NOISE, WIDTH, DEPTH, BATCH, STEPS = 128, 1024, 12, 16, 8
# The largest submodules are Linear(1024, 1024), 4 MiB: training streams two
# of them and one's gradients and two AdamW states (5 x 4 MiB).
G_BUDGET = D_BUDGET = 24 * MiB


def mlp(inputs: int, outputs: int) -> torch.nn.Module:
    layers = [torch.nn.Linear(inputs, WIDTH), torch.nn.LeakyReLU(0.2)]
    for _ in range(DEPTH - 2):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.LeakyReLU(0.2)]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, outputs))


def train(offload: bool) -> dict:
    _common.start()
    generator, discriminator = mlp(NOISE, WIDTH), mlp(WIDTH, 1)
    adam = dict(lr=2e-4, betas=(0.5, 0.999), fused=True)
    if offload:
        g_handle = torch_uvm.offload(generator, budget=G_BUDGET)
        d_handle = torch_uvm.offload(discriminator, budget=D_BUDGET)
        g_opt = g_handle.stream_optimizer(torch.optim.AdamW(generator.parameters(), **adam))
        d_opt = d_handle.stream_optimizer(torch.optim.AdamW(discriminator.parameters(), **adam))
    else:
        g_handle = d_handle = None
        generator.cuda()
        discriminator.cuda()
        g_opt = torch.optim.AdamW(generator.parameters(), **adam)
        d_opt = torch.optim.AdamW(discriminator.parameters(), **adam)
    real_data = torch.randn(STEPS, BATCH, WIDTH).cuda() * 0.5 + 1.0
    noise = torch.randn(STEPS, BATCH, NOISE).cuda()
    ones, zeros = torch.ones(BATCH, 1, device="cuda"), torch.zeros(BATCH, 1, device="cuda")
    losses = []
    for step in range(STEPS):
        fake = generator(noise[step])
        # the discriminator: real against generated
        d_loss = (F.binary_cross_entropy_with_logits(discriminator(real_data[step]), ones)
                  + F.binary_cross_entropy_with_logits(discriminator(fake.detach()), zeros))
        d_loss.backward()
        d_opt.step()
        d_opt.zero_grad()
        # the generator, through the frozen discriminator
        discriminator.requires_grad_(False)
        g_loss = F.binary_cross_entropy_with_logits(discriminator(fake), ones)
        g_loss.backward()
        g_opt.step()
        g_opt.zero_grad()
        discriminator.requires_grad_(True)
        losses += [d_loss.detach(), g_loss.detach()]
    return _common.finish(losses, {"generator": generator, "discriminator": discriminator},
                          [g_opt, d_opt], [g_handle, d_handle], G_BUDGET + D_BUDGET)


if __name__ == "__main__":
    _common.main(train)
