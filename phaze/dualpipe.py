"""DualPipe, DeepSeek-V3's bidirectional pipeline schedule, as its code runs it.

Micro-batches enter from both ends: half flow from stage 0 to stage pp - 1, half the other way.
Rank ``r`` holds two chunks, stage ``r`` of the first direction and stage ``pp - 1 - r`` of the
second (so two copies of every stage's parameters), and in its steady state runs a forward chunk
of one direction beside a backward chunk of the other, each one's all-to-alls under the other's
compute. :func:`actions` is the order of ``DualPipe.step`` (the ``dualpipe`` 1.0.0 package on PyPI,
``dualpipe/dualpipe.py``, DeepSeek-AI 2025), step by step; :func:`finish_times` runs it with
blocking batched sends (each ``_commit_and_wait_comm`` waits for its peers' matching operations),
and :func:`peak_inflight` counts the chunks' activations a rank holds. The DeepSeek-V3 report
(arXiv:2412.19437, Table 2) gives the bubble (PP/2 - 1)(F&B + B - 3W), 2x parameters and PP + 1
micro-batches' activations; the tests check the port against all three.
"""
from __future__ import annotations

from functools import lru_cache, partial


def schedule_error(pp: int, m: int) -> str | None:
    """Why DualPipe cannot run ``m`` micro-batches (both directions together) on ``pp`` stages,
    from ``DualPipe.step``'s asserts; None when it can."""
    if pp < 2 or pp % 2:
        return f"needs an even number of pipeline stages, got pp={pp}"
    if m % 2 or m < 2 * pp:
        return (f"needs an even number of micro-batches per step, at least 2 * pp = {2 * pp} (DualPipe.step "
                f"asserts num_chunks % 2 == 0 and num_chunks >= num_ranks * 2), got {m}")
    return None


@lru_cache(maxsize=256)
def actions(pp: int, m: int) -> tuple[tuple, ...]:
    """Each rank's operations in ``DualPipe.step``'s order. Directions: 0 enters at rank 0, 1 at
    rank pp - 1. Operations: ``("F", d)``, ``("B", d, zero_bubble)`` (a zero-bubble backward
    leaves its weight gradients for a later ``("W",)``), ``("FB", d_forward, d_backward)`` (two
    chunks overlapped), ``("W",)`` (the oldest deferred weight gradients) and ``("wait", ops)``,
    where ``ops`` are the sends and receives posted since the last wait, each
    ``(op, kind, d, src, dst, index)``: ``index`` counts the transfers of that kind and direction
    between the two ranks."""
    assert schedule_error(pp, m) is None, schedule_error(pp, m)
    return tuple(_rank_actions(pp, m, r) for r in range(pp))


def _rank_actions(pp: int, m: int, rank: int) -> tuple:
    half = pp // 2
    h = min(rank, pp - 1 - rank)          # half_rank
    second = rank >= half                 # is_in_second_half: phase 0 is the second direction
    middle = rank in (half - 1, half)
    acts: list = []
    posted: list = []
    sent = {}

    def d(phase):
        return phase ^ second

    def first_stage(dd):
        return (rank == 0 and dd == 0) or (rank == pp - 1 and dd == 1)

    def last_stage(dd):
        return (rank == 0 and dd == 1) or (rank == pp - 1 and dd == 0)

    def step_to(dd, ahead):              # the next rank along direction dd (or the one before)
        return rank + (1 if (dd == 0) == ahead else -1)

    def transfer(op, kind, ph):
        """``_recv_forward``, ``_send_forward``, ``_recv_backward``, ``_send_backward``: activations
        go ahead along the direction and gradients back; none before its first stage or after
        its last."""
        dd = d(ph)
        ahead = (kind == "act") == (op == "send")
        if last_stage(dd) if ahead else first_stage(dd):
            return
        peer = step_to(dd, ahead)
        key = (op, kind, dd) + ((rank, peer) if op == "send" else (peer, rank))
        sent[key] = sent.get(key, -1) + 1
        posted.append(key + (sent[key],))

    recv_f, send_f = partial(transfer, "recv", "act"), partial(transfer, "send", "act")
    recv_b, send_b = partial(transfer, "recv", "grad"), partial(transfer, "send", "grad")

    def wait():
        if posted:
            acts.append(("wait", tuple(posted)))
            posted.clear()

    def forward(ph, recv=True, send=True):
        if recv:
            recv_f(ph)
        wait()
        acts.append(("F", d(ph)))
        if send:
            send_f(ph)

    def backward(ph, zb=False, recv=True, send=True):
        if recv:
            recv_b(ph)
        wait()
        acts.append(("B", d(ph), zb))
        if send:
            send_b(ph)

    def forward_backward(p0, p1, recv0=True):
        if recv0:
            recv_f(p0)
        recv_b(p1)
        wait()
        acts.append(("FB", d(p0), d(p1)))
        send_f(p0)
        send_b(p1)

    def weight():
        wait()
        acts.append(("W",))

    for _ in range((half - h - 1) * 2):                  # step 1: nF0
        forward(0)
    recv_f(0)                                           # step 2: nF0F1
    for i in range(h + 1):
        forward(0, recv=False, send=middle)
        recv_f(0)
        forward(1, send=(not middle) or i < h)
        if not middle:
            send_f(0)
    for _ in range(half - h - 1):                       # step 3: nB1W1F1 (zero bubble)
        backward(1, zb=True)
        recv_f(1)
        weight()
        forward(1, recv=False)
    for i in range(m // 2 - pp + h + 1):                # step 4 (main): nF0B1F1B0
        if i == 0 and middle:                           # not overlapped, to shorten the bubble
            forward(0, recv=False, send=False)
            send_f(1)
            backward(1, send=False)
            send_f(0)
            send_b(1)
        else:
            forward_backward(0, 1, recv0=i > 0)
        forward_backward(1, 0)
    for _ in range(half - h - 1):                       # step 5: nB1F1B0
        backward(1)
        forward_backward(1, 0)
    zb = False
    for i in range(h + 1):                              # step 6: nB1B0, the second half zero bubble
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        backward(1, zb=zb)
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        backward(0, zb=zb)
    for _ in range(half - h - 1):                       # step 7: nWB0
        weight()
        backward(0, zb=True)
    for _ in range(h + 1):                              # step 8: nW
        weight()
    wait()
    return tuple(acts)


def chunk_stage(pp: int, rank: int, d: int) -> int:
    """The pipeline stage whose layers rank ``rank`` runs for direction ``d``."""
    return rank if d == 0 else pp - 1 - rank


def finish_times(pp: int, m: int, fwd, bwd, wgt, fwd_paired=None, bwd_paired=None, send_s: float = 0.0
                 ) -> list[float]:
    """Seconds until each rank has run its part of ``DualPipe.step``. ``fwd[s]``, ``bwd[s]``:
    one micro-batch's forward and (whole) backward on stage ``s``'s layers; ``wgt[s]``: the
    weight-gradient part of ``bwd[s]``, which a zero-bubble backward leaves for its ``W``;
    ``fwd_paired``/``bwd_paired`` (default ``fwd``/``bwd``): the same when a forward and a
    backward chunk run overlapped (``FB``: the sum of the two). Each wait ends ``send_s`` after the
    last of its operations' peers posted theirs (a transfer starts when both ends have posted)."""
    fwd_paired = fwd if fwd_paired is None else fwd_paired
    bwd_paired = bwd if bwd_paired is None else bwd_paired
    acts = actions(pp, m)
    clock = [0.0] * pp
    at = [0] * pp
    posted: dict = {}
    deferred: list[list[float]] = [[] for _ in range(pp)]
    done = 0
    while done < pp:
        moved = False
        done = 0
        for r in range(pp):
            ops = acts[r]
            while at[r] < len(ops):
                a = ops[at[r]]
                if a[0] == "wait":
                    for op in a[1]:
                        posted.setdefault(op, clock[r])
                    peers = [("recv" if op[0] == "send" else "send",) + op[1:] for op in a[1]]
                    if any(p not in posted for p in peers):
                        break
                    clock[r] = max(clock[r], max(posted[p] for p in peers) + send_s)
                elif a[0] == "F":
                    clock[r] += fwd[chunk_stage(pp, r, a[1])]
                elif a[0] == "B":
                    s = chunk_stage(pp, r, a[1])
                    if a[2]:
                        clock[r] += bwd[s] - wgt[s]
                        deferred[r].append(wgt[s])
                    else:
                        clock[r] += bwd[s]
                elif a[0] == "W":
                    clock[r] += deferred[r].pop(0)
                else:   # FB
                    clock[r] += fwd_paired[chunk_stage(pp, r, a[1])] + bwd_paired[chunk_stage(pp, r, a[2])]
                at[r] += 1
                moved = True
            else:
                done += 1
        if not moved and done < pp:
            raise RuntimeError("DualPipe schedule deadlocked")   # the port's own check: cannot happen
    return clock


@lru_cache(maxsize=256)
def peak_inflight(pp: int, m: int, rank: int) -> tuple[int, int]:
    """(micro-batches of direction 0, of direction 1) whose activations rank ``rank`` holds at
    its peak. A forward chunk adds one; a backward frees one when it ends, so a forward
    overlapped with a backward holds both. Counted in chunks, each weighted alike: the peak
    is at the first overlapped pair, ``pp - h`` and ``h + 1`` on the chunks of stages ``h`` and
    ``pp - 1 - h`` (``h = min(rank, pp - 1 - rank)``), together PP + 1 (the report's Table 2)."""
    held, best, best_total = [0, 0], (0, 0), -1
    for a in actions(pp, m)[rank]:
        if a[0] == "F":
            held[a[1]] += 1
        elif a[0] == "FB":
            held[a[1]] += 1
        if sum(held) > best_total:
            best, best_total = (held[0], held[1]), sum(held)
        if a[0] == "B":
            held[a[1]] -= 1
        elif a[0] == "FB":
            held[a[2]] -= 1
    return best
