"""The shared KV cache of a batch of sequences at different lengths: one row per sequence, rows ``0..n−1`` in use.

Per layer, keys and values live in one ``(S, Hkv, capacity, E)`` buffer (S = the most sequences decoded
together). Sequence ``b`` holds its ``len_b`` cached tokens in ``[b, :, :len_b]``; a decoding step feeds one
new token per row, writes its key and value at ``[b, :, len_b]``, and attends over ``[:n, :, :max_b len_b + 1]``
with a mask that hides each row's unused tail. The rows in use are always ``0..n−1`` (a finished
sequence's row is refilled by moving the last row into it), so that slice is a view: no step gathers the
cache.

The capacity grows by doubling (up to the context length) when a sequence needs more, so memory follows
the longest sequence being served, not the model's context. Growing allocates every layer's new buffers
first and swaps them in only once all exist: an allocation that fails (out of memory) raises and leaves
every layer as it was, all at the old capacity.

The attention layers see an object with ``append(k, v)`` (and ``static = False``), like
:class:`tokennet.attention.multihead.KVCache`; :class:`SlotCaches` tells every layer's cache what the
next forward writes (:meth:`SlotCaches.plan_prefill`, :meth:`SlotCaches.plan_decode`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["SlotCache", "SlotCaches"]


class SlotCache:
    """One layer's rows of keys and values (see the module docstring)."""

    static = False

    def __init__(self, k: Tensor, v: Tensor, owner: SlotCaches):
        self.k, self.v, self._owner = k, v, owner

    @property
    def length(self) -> int:
        """For the model's own position bookkeeping: the tokens before this forward's first (0 in a prefill)."""
        return self._owner.offset

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens' ``(B, Hkv, n, E)`` keys/values as planned; return the keys/values to attend over."""
        o = self._owner
        if o.mode == "prefill":
            r, n = o.row, k.shape[2]
            self.k[r : r + 1, :, :n] = k
            self.v[r : r + 1, :, :n] = v
            return self.k[r : r + 1, :, :n], self.v[r : r + 1, :, :n]
        rows = o.rows_index  # (B,)
        self.k[rows, :, o.write_at] = k[:, :, 0]  # (B, Hkv, E) into each row's next slot
        self.v[rows, :, o.write_at] = v[:, :, 0]
        return self.k[o.rows, :, : o.n_keys], self.v[o.rows, :, : o.n_keys]


class SlotCaches:
    """Every layer's :class:`SlotCache` and the plan of the next forward.

    Args:
        num_layers, num_kv_heads, head_dim: the model's L, Hkv and E.
        slots: S, the most sequences held at once.
        max_len: the longest sequence (the context length); the capacity never exceeds it.
        device, dtype: of the buffers (the model's).
        capacity: the initial capacity in tokens.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, slots: int, max_len: int, *,
                 device=None, dtype=torch.float32, capacity: int = 256):
        self.slots, self.max_len = slots, max_len
        self.capacity = min(capacity, max_len)
        shape = (slots, num_kv_heads, self.capacity, head_dim)
        self.layers = [SlotCache(torch.zeros(shape, device=device, dtype=dtype),
                                 torch.zeros(shape, device=device, dtype=dtype), self) for _ in range(num_layers)]
        self.mode, self.row, self.offset, self.n_keys = "prefill", 0, 0, 0
        self.rows_index: Tensor | None = None
        self.write_at: Tensor | None = None
        self.rows = slice(0, 0)  # the rows a decoding forward reads (a view of the buffers)

    def ensure(self, length: int) -> None:
        """Grow every buffer (doubling) so a row can hold ``length`` tokens."""
        if length > self.max_len:
            raise ValueError(f"{length} tokens exceed the cache's context of {self.max_len}")
        if length <= self.capacity:
            return
        cap = self.capacity
        while cap < length:
            cap = min(2 * cap, self.max_len)
        # Every new buffer first: an allocation that fails here leaves each layer at the old capacity.
        grown = [(self._alloc(c.k, cap), self._alloc(c.v, cap)) for c in self.layers]
        for c, (k, v) in zip(self.layers, grown):
            k[:, :, : self.capacity] = c.k
            v[:, :, : self.capacity] = c.v
        for c, (k, v) in zip(self.layers, grown):
            c.k, c.v = k, v
        self.capacity = cap

    @staticmethod
    def _alloc(like: Tensor, capacity: int) -> Tensor:
        """A zeroed buffer like ``like`` ``(S, Hkv, capacity', E)`` with ``capacity`` tokens per row."""
        return like.new_zeros(like.shape[0], like.shape[1], capacity, like.shape[3])

    def plan_prefill(self, row: int, length: int) -> None:
        """The next forward is one sequence's prompt ``(1, length)``, written to row ``row`` from position 0."""
        self.ensure(length)
        self.mode, self.row, self.offset = "prefill", row, 0

    def plan_decode(self, lengths: Tensor, first: int = 0) -> Tensor:
        """The next forward feeds one token to rows ``first..first+B−1``, whose caches hold ``lengths`` ``(B,)``.

        ``first`` is 0 for the whole batch; another value retries one row alone (the engine's fallback when a
        batched forward fails). Returns the key mask ``(B, 1, 1, Nk)``, ``Nk = max(lengths) + 1``: True where a
        row's key is real.
        """
        n_keys = int(lengths.max()) + 1
        self.ensure(n_keys)
        B = len(lengths)
        self.mode, self.n_keys, self.offset = "decode", n_keys, n_keys - 1
        self.rows_index = torch.arange(first, first + B, device=lengths.device)
        self.rows = slice(first, first + B)
        self.write_at = lengths
        keys = torch.arange(n_keys, device=lengths.device)
        return (keys[None, :] <= lengths[:, None])[:, None, None, :]  # (B, 1, 1, Nk)

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy row ``src``'s first ``length`` tokens to row ``dst`` (a finished sequence's row is refilled)."""
        if src == dst:
            return
        for c in self.layers:
            c.k[dst, :, :length] = c.k[src, :, :length]
            c.v[dst, :, :length] = c.v[src, :, :length]
