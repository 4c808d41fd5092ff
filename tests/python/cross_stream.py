"""One cross-stream check shared by the record_stream tests with UVM on (in
the test process) and off (in a subprocess)."""
import torch


def reuse_while_busy(make, rounds: int = 5, sleep_cycles: int = 500_000_000):
    """Each round: x made on s1, read on s2 behind a long sleep,
    x.record_stream(s2), del x, then a same-size allocation on s1.

    Returns (busy, reused, bad): the rounds in which s2 was still reading when
    that allocation returned (checked after it, so no race makes a legitimate
    reuse look wrong), how many of those handed out x's block (must be 0), and
    the rounds whose result s2 computed wrongly. `make` turns a CUDA tensor
    into the tensor under test (identity with UVM on, manage_memory off)."""
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s1):          # warm up: no first-call delays below
        make(torch.ones(1 << 16, device="cuda")).fill_(0)
    torch.cuda.synchronize()
    busy = reused = bad = 0
    for _ in range(rounds):
        with torch.cuda.stream(s1):
            x = make(torch.ones(1 << 16, device="cuda"))
            ready = torch.cuda.current_stream().record_event()
        with torch.cuda.stream(s2):
            torch.cuda._sleep(sleep_cycles)
            torch.cuda.current_stream().wait_event(ready)
            y = x * 3
            done = torch.cuda.current_stream().record_event()
        x.record_stream(s2)
        ptr = x.data_ptr()
        del x
        with torch.cuda.stream(s1):
            z = make(torch.empty(1 << 16, device="cuda"))
            if not done.query():
                busy += 1
                reused += z.data_ptr() == ptr
            z.fill_(0)                   # would clobber x before s2 reads it
        torch.cuda.synchronize()
        bad += not torch.equal(y, torch.full_like(y, 3.0))
    return busy, reused, bad
