"""The least a full fine-tune's step can take on this host, counted with the
rates the host was seen to reach *together*, and with the step's phases
(issue 58's "floors that are floors"). docs/design.md, "The floors", states
each formula; tests/python/test_floors.py checks each by hand.

**Placements.** Each byte of weights is placed one way. `placements(states,
casts)` gives, per weight byte, what each way moves:

- to the GPU and home over the link;
- how much of it steps on the host;
- the budget it takes;
- the host's memory that stepping it takes;
- which of the bytes to the GPU the forward reads, and which the backward
  reads.

`states` is the optimizer's state bytes per weight byte. AdamW's two fp32
moments give 2; 8-bit moments give 0.5. With `casts`, what crosses for
compute under bf16 autocast is the weights' bf16 casts and their bf16
gradients.

**Regimes.** The link's two directions and the host's AdamW share the
host's memory. What each reaches depends on what runs beside it, so the
floor takes only combinations whose rates this run measured (`regimes`):

- each direction alone;
- both directions at once;
- the AdamW alone;
- all three at once.

A pair not measured, a copy beside the AdamW with the other direction
idle, counts at the three's rates, the other direction unused. A schedule
is any mix of regimes over time, so a step's least is a linear program in
the time spent in each regime in each phase.

**Phases.** The forward reads its streamed weights during the forward, and
the backward reads them during the backward. A gradient exists only once
the backward makes it. With `carry`, a step's copies home and host steps
may run on into the next step's forward: `non_blocking` does that, and
only a forward that needs the weight waits. Without `carry`, they end
before the next forward: a third phase after the backward holds what the
backward's time could not.

The GPU's forward and backward, `compute_s`, bound their phases from below
(0: not counted).

**This is an estimate, not a floor.** A schedule could run at rates this
run did not see together. It is the least at the rates seen, where
method.least_step_s's solo rates run everything at once at each one's best.
"""
from typing import Dict, Optional, Tuple

GiB = float(1 << 30)

# A fused AdamW step reads each fp32 weight's value, gradient and two
# moments, and writes the value and the moments: 28 bytes of the host's
# memory per 4-byte weight it steps.
ADAMW_HOST_MEMORY = 7
# Casting a host-stepped weight to bf16 (4 bytes read, 2 written) and its
# gradient up to fp32 (2 read, 4 written): 12 more bytes a 4-byte weight.
CAST_HOST_MEMORY = 3

FIELDS = ("to_gpu", "home", "host_step", "budget", "host_memory", "forward_reads",
          "backward_reads", "states_in")


def placements(states: float = 2.0, casts: bool = False) -> Dict[str, Tuple[float, ...]]:
    """Per weight byte of fp32 weights, for each way a full fine-tune can
    place it, the FIELDS:

    - to the GPU and home over the link;
    - the bytes stepped on the host, and the budget taken;
    - the host's memory a byte stepped there takes;
    - of the bytes to the GPU, those the forward reads, those the
      backward reads, and the states brought for a GPU step (which need
      no gradient: they may come during the forward).

    `states`: the optimizer's state bytes per weight byte (AdamW 2,
    8-bit AdamW 0.5). It counts where the states cross, that is where a GPU
    steps a weight whose states are not resident. `casts`: under bf16
    autocast, a host-stepped weight's bf16 cast crosses for compute (half
    its bytes), and its bf16 gradient goes home. A GPU step still takes the
    fp32 weight in the backward, and sends home the bf16 cast the next
    forward reads beside the stepped fp32 weight."""
    if states < 0:
        raise ValueError(f"placements: states must be >= 0 bytes a weight byte, got {states}")
    c = 0.5 if casts else 1.0                     # what the compute reads of a weight byte
    host = ADAMW_HOST_MEMORY + (CAST_HOST_MEMORY if casts else 0)
    s = float(states)
    streamed_host = "streamed casts, host step" if casts else "streamed, host step"
    resident_host = "resident cast, host step" if casts else "resident, host step"
    cast_home = c if casts else 0.0              # the next forward's cast, made on the GPU
    return {
        # in for both passes, its gradient home, stepped there
        streamed_host: (2 * c, c, 1, 0, host, c, c, 0),
        # in for the forward (a cast where autocast makes one) and for the
        # backward (fp32: the GPU steps it), its states both ways
        "streamed, GPU step": (c + 1 + s, 1 + s + cast_home, 0, 0, 0, c, 1, s),
        # the gradient home, the stepped weight (or its cast) back
        resident_host: (c, c, 1, c, host, 0, 0, 0),
        # its states both ways
        "resident, GPU step": (s, s, 0, 1, 0, 0, 0, s),
        "resident with states": (0, 0, 0, 1 + s, 0, 0, 0, 0),
    }


FREE = 1e18
# The rates of a run's pinned_rate answer that regimes reads.
RATE_KEYS = ("h2d_gbps", "d2h_gbps", "both_ways_h2d_gbps", "both_ways_d2h_gbps",
             "adamw_alone_elements_per_s", "adamw_beside_copies_elements_per_s",
             "h2d_beside_adamw_gbps", "d2h_beside_adamw_gbps")
REGIMES = ("to the GPU alone", "home alone", "both ways", "AdamW alone", "all three")


def regimes(rates: dict) -> Dict[str, Tuple[float, float, float]]:
    """(bytes/s to the GPU, bytes/s home, fp32 elements/s the host steps) in
    each regime, from a run's pinned_rate answer: `h2d_gbps`, `d2h_gbps`
    (each direction alone), and shared_host_rates' keys (both ways at once,
    the AdamW alone, and the AdamW beside both ways with the copies' rates
    then). KeyError names what the run did not measure. A rate above
    FREE counts as FREE: free at any size a host holds, and within what the
    solver can scale."""
    g = 1e9
    found = {
        "to the GPU alone": (rates["h2d_gbps"] * g, 0.0, 0.0),
        "home alone": (0.0, rates["d2h_gbps"] * g, 0.0),
        "both ways": (rates["both_ways_h2d_gbps"] * g, rates["both_ways_d2h_gbps"] * g, 0.0),
        "AdamW alone": (0.0, 0.0, rates["adamw_alone_elements_per_s"]),
        "all three": (rates["h2d_beside_adamw_gbps"] * g, rates["d2h_beside_adamw_gbps"] * g,
                      rates["adamw_beside_copies_elements_per_s"]),
    }
    return {k: tuple(min(v, FREE) for v in vs) for k, vs in found.items()}


PHASES = ("forward", "backward", "after")


def least_step_together_s(weights: int, budget: int, rates: dict,
                          compute_s: Tuple[float, float] = (0.0, 0.0), carry: bool = True,
                          ways: Optional[Dict[str, Tuple[float, ...]]] = None) -> dict:
    """The least seconds a step of a full fine-tune of `weights` fp32 bytes
    takes with `budget` bytes of GPU memory for it, the link and the host
    at the rates `rates` measured together (`regimes`), over the step's
    phases. Each weight byte is placed one of `ways` (default:
    placements()).

    The variables are the bytes of each placement, and the seconds spent in
    each regime in each phase. The least total time is a linear program
    (scipy's linprog):

    - the forward's phase carries the forward's reads, and the backward's
      phase the backward's;
    - all the phases together carry every byte each way and every element
      the host steps;
    - without `carry`, the copies home, the host's steps and the weights
      coming back from a step end before the next forward (the states a
      GPU step brings need no gradient: they may come in the forward);
    - the forward's and the backward's phases last at least `compute_s`.

    Returns the seconds, each phase's seconds, the bytes of each placement,
    and the seconds in each regime."""
    from scipy.optimize import linprog
    ways = ways or placements()
    rate = regimes(rates)
    names, regs = list(ways), list(rate)
    cols = [ways[n] for n in names]
    np_, nr = len(names), len(regs)
    nvar = np_ + len(PHASES) * nr

    def tau(phase: int, r: int) -> int:
        return np_ + phase * nr + r

    def row(place=None, times=None):
        """A constraint row <= 0: sum of place[i] x_i (GiB) + sum of
        times[(phase, r)] tau (s)."""
        out = [0.0] * nvar
        for i, v in enumerate(place or []):
            out[i] = v
        for (p, r), v in (times or {}).items():
            out[tau(p, r)] = v
        return out

    def capacity(phases, k, scale):
        """-(what `phases` carry of resource k), per GiB of work."""
        return {(p, r): -rate[regs[r]][k] * scale / GiB for p in phases for r in range(nr)}

    a_ub, b_ub = [], []
    fwd, bwd = PHASES.index("forward"), PHASES.index("backward")
    everywhere = range(len(PHASES))
    not_forward = [bwd, PHASES.index("after")]
    # each pass's reads within its phase
    a_ub.append(row([col[5] for col in cols], capacity([fwd], 0, 1.0)))
    a_ub.append(row([col[6] for col in cols], capacity([bwd], 0, 1.0)))
    # everything to the GPU; without carry, what needs a step (a stepped
    # weight coming back) or a backward (its reads) after the forward
    a_ub.append(row([col[0] for col in cols], capacity(everywhere, 0, 1.0)))
    if not carry:
        a_ub.append(row([col[0] - col[5] - col[7] for col in cols],
                        capacity(not_forward, 0, 1.0)))
    # home, and the host's steps (fp32 elements, slower where it also casts)
    host_work = [col[2] / 4 * (col[4] / ADAMW_HOST_MEMORY if col[4] else 1) for col in cols]
    for phases in ([everywhere] if carry else [not_forward]):
        a_ub.append(row([col[1] for col in cols], capacity(phases, 1, 1.0)))
        a_ub.append(row(host_work, capacity(phases, 2, 1.0)))
    b_ub += [0.0] * len(a_ub)
    # the budget
    a_ub.append(row([col[3] for col in cols]))
    b_ub.append(budget / GiB)
    # the GPU's compute bounds the forward's and the backward's phases
    for p, least in ((fwd, compute_s[0]), (bwd, compute_s[1])):
        a_ub.append(row(None, {(p, r): -1.0 for r in range(nr)}))
        b_ub.append(-float(least))
    a_eq, b_eq = [[1.0] * np_ + [0.0] * (nvar - np_)], [weights / GiB]
    c = [0.0] * np_ + [1.0] * (nvar - np_)
    sol = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq,
                  bounds=[(0, None)] * nvar, method="highs")
    if not sol.success:
        raise RuntimeError(f"least_step_together_s: no placement found ({sol.message})")
    x = sol.x
    phase_s = {ph: float(sum(x[tau(p, r)] for r in range(nr))) for p, ph in enumerate(PHASES)}
    return {"seconds": float(sum(phase_s.values())), "phase_seconds": phase_s,
            "mix_bytes": {n: round(float(x[i]) * GiB) for i, n in enumerate(names)
                          if x[i] * GiB > 0.5},
            "regime_seconds": {f"{ph}: {regs[r]}": float(x[tau(p, r)])
                               for p, ph in enumerate(PHASES) for r in range(nr)
                               if x[tau(p, r)] > 1e-12}}

