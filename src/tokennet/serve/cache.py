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
next forward writes (:meth:`SlotCaches.plan_prefill`, :meth:`SlotCaches.plan_decode`, and
:meth:`SlotCaches.plan_verify` for speculative decoding's several tokens a row). A prefill may start
past a row's first tokens (``plan_prefill(row, n, start=m)``): the row's first ``m`` keys and values were
copied in from the :class:`PrefixCache`, and only the rest of the prompt is computed.

**Prefix caching** (:class:`PrefixCache`; vLLM's automatic prefix caching, Kwon et al. 2023,
https://arxiv.org/abs/2309.06180, and SGLang's RadixAttention, Zheng et al. 2024, https://arxiv.org/abs/2312.07104):
requests that share a beginning — a system prompt, a few-shot block, a chat's earlier turns — share its keys
and values. Causal attention makes the keys and values of token ``i`` a function of tokens ``0..i`` only, so
those of a prompt's first ``m`` tokens can be reused by every prompt that begins with the same ``m`` tokens.
The cache holds blocks of ``block`` tokens; a block is named by its parent block and its own token ids
(vLLM's hash of blocks: ``key_j = (id(block_{j−1}), tokens[j·b : (j+1)·b])``), so a lookup walks a prompt
block by block, as a radix tree of blocks. Keys compare the token ids themselves, never a hash of them: a
block is reused only for exactly its tokens after exactly its parent. It is bounded in bytes and evicts the
least recently used block (with its descendants, which no lookup can reach without it).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

import torch
from torch import Tensor

__all__ = ["SlotCache", "SlotCaches", "PrefixCache", "DecodePlan"]


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
        owner = self._owner
        if owner.mode == "prefill":  # after the o.offset tokens already in the row (a cached prefix, or none)
            row, begin, end = owner.row, owner.offset, owner.offset + k.shape[2]
            self.k[row : row + 1, :, begin:end] = k
            self.v[row : row + 1, :, begin:end] = v
            return self.k[row : row + 1, :, :end], self.v[row : row + 1, :, :end]
        if owner.mode == "verify":  # T tokens a row, at lengths_b + 0..T−1
            rows = owner.rows_index[:, None]  # (B, 1), broadcast against write_at (B, T)
            self.k[rows, :, owner.write_at] = k.transpose(1, 2)  # (B, T, Hkv, E)
            self.v[rows, :, owner.write_at] = v.transpose(1, 2)
            return self.k[owner.rows, :, : owner.n_keys], self.v[owner.rows, :, : owner.n_keys]
        rows = owner.rows_index  # (B,)
        self.k[rows, :, owner.write_at] = k[:, :, 0]  # (B, Hkv, E) into each row's next slot
        self.v[rows, :, owner.write_at] = v[:, :, 0]
        return self.k[owner.rows, :, : owner.n_keys], self.v[owner.rows, :, : owner.n_keys]


class DecodePlan:
    """The plan of a decoding forward of rows ``0..B−1`` (what :meth:`SlotCaches.plan_decode` sets), for a compiled
    step that builds its :class:`SlotCache` views inside the graph over the given buffers.

    Args:
        lengths: ``(B,)`` each row's cached tokens (its new token's key and value are written there).
        n_keys: ``max(lengths) + 1``, the keys attended over.
    """

    mode = "decode"

    def __init__(self, lengths: Tensor, n_keys, rows_index: Tensor):
        self.write_at, self.n_keys, self.offset = lengths, n_keys, n_keys - 1
        self.rows_index = rows_index
        self.rows = slice(0, lengths.shape[0])


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
        grown = [(self._alloc(layer.k, cap), self._alloc(layer.v, cap)) for layer in self.layers]
        for layer, (k, v) in zip(self.layers, grown):
            k[:, :, : self.capacity] = layer.k
            v[:, :, : self.capacity] = layer.v
        for layer, (k, v) in zip(self.layers, grown):
            layer.k, layer.v = k, v
        self.capacity = cap

    @staticmethod
    def _alloc(like: Tensor, capacity: int) -> Tensor:
        """A zeroed buffer like ``like`` ``(S, Hkv, capacity', E)`` with ``capacity`` tokens per row."""
        return like.new_zeros(like.shape[0], like.shape[1], capacity, like.shape[3])

    def plan_prefill(self, row: int, length: int, start: int = 0) -> None:
        """The next forward is one sequence's prompt tokens ``start..length−1`` ``(1, length − start)``, written to
        row ``row`` after its first ``start`` tokens (a cached prefix already copied in, :meth:`load_prefix`)."""
        self.ensure(length)
        self.mode, self.row, self.offset = "prefill", row, start

    def read(self, row: int, start: int, end: int) -> list[tuple[Tensor, Tensor]]:
        """Row ``row``'s keys and values of tokens ``start..end−1``, per layer: views ``(Hkv, end − start, E)``."""
        return [(layer.k[row, :, start:end], layer.v[row, :, start:end]) for layer in self.layers]

    def load_prefix(self, row: int, kv: list[tuple[Tensor, Tensor]]) -> None:
        """Write per-layer keys and values ``(Hkv, m, E)`` into row ``row``'s first ``m`` tokens."""
        m = kv[0][0].shape[1]
        self.ensure(m)
        for layer, (k, v) in zip(self.layers, kv):
            layer.k[row, :, :m] = k
            layer.v[row, :, :m] = v

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

    def plan_verify(self, lengths: Tensor, width: int, first: int = 0) -> Tensor:
        """The next forward feeds ``width`` tokens to each of rows ``first..first+B−1`` (speculative decoding's
        verification: a row's last token and its drafts, padded to ``width``), written at ``lengths_b + t``.

        Returns the key mask ``(B, 1, width, Nk)``, ``Nk = max(lengths) + width``: query ``t`` of row ``b`` sees the
        keys ``j <= lengths_b + t``, its own cached tokens and the tokens fed before it. A padded position writes its
        key past what the row keeps; the row's length never counts it, and the next forward overwrites it.
        """
        n_keys = int(lengths.max()) + width
        self.ensure(n_keys)
        B = len(lengths)
        self.mode, self.n_keys, self.offset = "verify", n_keys, n_keys - width
        self.rows_index = torch.arange(first, first + B, device=lengths.device)
        self.rows = slice(first, first + B)
        self.write_at = lengths[:, None] + torch.arange(width, device=lengths.device)  # (B, width)
        keys = torch.arange(n_keys, device=lengths.device)
        return (keys[None, None, :] <= self.write_at[:, :, None])[:, None]  # (B, 1, width, Nk)

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy row ``src``'s first ``length`` tokens to row ``dst`` (a finished sequence's row is refilled)."""
        if src == dst:
            return
        for layer in self.layers:
            layer.k[dst, :, :length] = layer.k[src, :, :length]
            layer.v[dst, :, :length] = layer.v[src, :, :length]


class _Block:
    """One cached block: ``kv (L, 2, Hkv, block, E)``, its parent's id, and its children's keys."""

    __slots__ = ("id", "key", "kv", "children")

    def __init__(self, id: int, key: tuple, kv: Tensor):
        self.id, self.key, self.kv, self.children = id, key, kv, set()


class PrefixCache:
    """Keys and values of prompt prefixes, in blocks of ``block`` tokens, least recently used evicted first.

    Args:
        budget_bytes: the most bytes of keys and values held (0: the cache holds nothing).
        block: tokens per block (vLLM's default 16): a prefix is reused in whole blocks.

    :meth:`match` finds the longest cached run of whole blocks a prompt begins with and returns its keys
    and values; :meth:`insert` stores the whole blocks of a sequence's tokens read from its cache row. Both
    mark the blocks they touch as just used, the deepest first, so a block is always more recently used
    than its descendants and eviction takes leaves before the prefixes they extend.
    """

    ROOT = -1  # the parent id of a first block

    def __init__(self, budget_bytes: int, block: int = 16):
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget, self.block = int(budget_bytes), block
        self.blocks: OrderedDict[tuple, _Block] = OrderedDict()  # key → block, least recently used first
        self._by_id: dict[int, _Block] = {}
        self._ids = itertools.count()
        self.bytes = 0
        self.hits = self.lookups = self.hit_tokens = self.evicted = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def _walk(self, tokens: list[int], n_blocks: int) -> list[_Block]:
        """The cached blocks of ``tokens``' first ``n_blocks`` whole blocks, as far as they are cached."""
        out, parent, block = [], self.ROOT, self.block
        for j in range(n_blocks):
            blk = self.blocks.get((parent, tuple(tokens[j * block : (j + 1) * block])))
            if blk is None:
                break
            out.append(blk)
            parent = blk.id
        return out

    def _touch(self, chain: list[_Block]) -> None:
        for blk in reversed(chain):  # the deepest first: every ancestor ends more recent than its descendants
            self.blocks.move_to_end(blk.key)

    def peek(self, tokens: list[int], limit: int | None = None) -> int:
        """How many tokens :meth:`match` would give now (whole blocks, at most ``limit``), without counting a lookup
        or marking anything used."""
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        return len(self._walk(tokens, limit // self.block)) * self.block

    def match(self, tokens: list[int], limit: int | None = None) -> tuple[int, list[tuple[Tensor, Tensor]] | None]:
        """The longest cached prefix of ``tokens`` of at most ``limit`` tokens, in whole blocks: ``(m, kv)``,
        ``kv`` per layer ``(Hkv, m, E)`` keys and values (``(0, None)``: nothing cached)."""
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        self.lookups += 1
        chain = self._walk(tokens, limit // self.block)
        if not chain:
            return 0, None
        self._touch(chain)
        self.hits += 1
        m = len(chain) * self.block
        self.hit_tokens += m
        stacked = torch.stack([blk.kv for blk in chain])  # (n, L, 2, Hkv, b, E)
        n, L, _, H, block, E = stacked.shape
        # (L, 2, Hkv, m, E): the blocks in order
        stacked = stacked.permute(1, 2, 3, 0, 4, 5).reshape(L, 2, H, n * block, E)
        return m, [(stacked[i, 0], stacked[i, 1]) for i in range(L)]

    def insert(self, tokens: list[int], read) -> int:
        """Store the whole blocks of ``tokens`` not cached yet; ``read(start, end)`` gives their keys and values
        per layer ``(Hkv, end − start, E)`` (views of a cache row). Returns the blocks added."""
        block = self.block
        n_blocks = len(tokens) // block
        chain = self._walk(tokens, n_blocks)
        if len(chain) == n_blocks or self.budget <= 0:
            self._touch(chain)
            return 0
        start = len(chain) * block
        layer_kv = read(start, n_blocks * block)  # per layer (Hkv, m', E)
        new = torch.stack([torch.stack([k, v]) for k, v in layer_kv])  # (L, 2, Hkv, m', E): one copy, off the row
        L, _, H, _, E = new.shape
        per_block = new[..., :block, :].nelement() * new.element_size()
        if per_block > self.budget:
            self._touch(chain)
            return 0
        first = len(chain)  # the first block not cached
        new = new.reshape(L, 2, H, n_blocks - first, block, E)
        parent = chain[-1] if chain else None
        added = 0
        for j in range(first, n_blocks):
            while self.bytes + per_block > self.budget:
                if not self._evict_one(keep=chain):
                    self._touch(chain)
                    return added  # the budget holds no more of this sequence's blocks
            key = (parent.id if parent is not None else self.ROOT, tuple(tokens[j * block : (j + 1) * block]))
            blk = _Block(next(self._ids), key, new[:, :, :, j - first].clone())  # (L, 2, Hkv, b, E)
            self.blocks[key] = blk
            self._by_id[blk.id] = blk
            if parent is not None:
                parent.children.add(key)
            self.bytes += per_block
            chain.append(blk)
            parent = blk
            added += 1
        self._touch(chain)
        return added

    def _evict_one(self, keep: list[_Block]) -> bool:
        """Drop the least recently used block not in ``keep`` (the chain being extended), with its descendants;
        False when every block is kept."""
        kept = {blk.key for blk in keep}
        for key in self.blocks:
            if key not in kept:
                self._drop(key)
                return True
        return False

    def _drop(self, key: tuple) -> None:
        blk = self.blocks.pop(key, None)
        if blk is None:
            return
        del self._by_id[blk.id]
        self.bytes -= blk.kv.nelement() * blk.kv.element_size()
        self.evicted += 1
        for child in list(blk.children):
            self._drop(child)
        parent = self._by_id.get(key[0])
        if parent is not None:
            parent.children.discard(key)

    def clear(self) -> None:
        self.blocks.clear()
        self._by_id.clear()
        self.bytes = 0

    def stats(self) -> dict:
        return {"blocks": len(self.blocks), "block_tokens": self.block, "bytes": self.bytes,
                "budget_bytes": self.budget,
                "lookups": self.lookups, "hits": self.hits, "hit_tokens": self.hit_tokens, "evicted": self.evicted}
