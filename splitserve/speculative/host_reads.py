"""Reading a step's small outputs on the host without draining the GPU's queue.

The engine's step (a speculative round, an AR step) leaves what the host needs, the committed
tokens and maybe the round's confidences, in device buffers that the next step overwrites. To
launch step k+1 before the host has read step k, so that the GPU never waits for Python between
steps, each step's outputs are copied in stream order into one of a few pinned host slots, and
an event marks when that copy has landed. The host then waits for step k's event only, where
`tensor.tolist()` would wait for everything queued, step k+1 included.

    reads = HostReads(device)
    ticket = reads.stage(out, conf)      # after launching step k: queue its copies
    ...                                  # launch step k+1
    out_k, conf_k = reads.read(ticket)   # lists, once step k's copies are done

A slot is reused `slots` stages later, so at most `slots` stages may be unread at once. Off CUDA
a stage is an ordinary copy, done when `stage` returns.
"""

from __future__ import annotations

import torch


class HostReads:
    def __init__(self, device: torch.device, slots: int = 2):
        self.device, self.slots = device, slots
        self.cuda = device.type == "cuda"
        self._bufs: list[list[torch.Tensor] | None] = [None] * slots  # pinned copies, per slot
        self._events = [torch.cuda.Event() for _ in range(slots)] if self.cuda else []
        self._next = 0
        self._unread: set[int] = set()

    def stage(self, *tensors: torch.Tensor) -> int:
        """Queue host copies of `tensors` behind the work already queued -> a ticket for `read`."""
        slot = self._next
        if slot in self._unread:
            raise RuntimeError(f"all {self.slots} host read slots hold unread steps; read one first")
        self._next = (slot + 1) % self.slots
        bufs = self._bufs[slot]
        if bufs is None or [(b.shape, b.dtype) for b in bufs] != [(t.shape, t.dtype) for t in tensors]:
            bufs = self._bufs[slot] = [torch.empty(t.shape, dtype=t.dtype, pin_memory=self.cuda) for t in tensors]
        for buf, t in zip(bufs, tensors):
            buf.copy_(t, non_blocking=self.cuda)
        if self.cuda:  # the copies ran on the stream of the tensors' device, which may not be the current one
            self._events[slot].record(torch.cuda.current_stream(self.device))
        self._unread.add(slot)
        return slot

    def read(self, ticket: int) -> list[list]:
        """The staged tensors of `ticket` as lists, waiting only for their own copies."""
        if ticket not in self._unread:
            raise RuntimeError(f"host read slot {ticket} holds no unread step")
        if self.cuda:
            self._events[ticket].synchronize()
        self._unread.discard(ticket)
        return [buf.tolist() for buf in self._bufs[ticket]]

    def drop_unread(self) -> None:
        """Forget staged steps nobody will read (a request that ended with a step in flight);
        their copies still land, in stream order, before any later stage's."""
        self._unread.clear()
