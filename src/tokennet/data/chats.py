"""Chat data for fine-tuning: ``{"messages": [...]}`` records, rendered with a chat template, loss on the replies.

A file of JSON lines, one conversation per line::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, ...]}

Each conversation is rendered with the tokenizer's chat template (an imported model's own, e.g.
SmolLM2's ChatML) or, for a tokenizer without one, plain ChatML text (:func:`tokennet.tokens.chat.render_chat`,
next to the tokenizer; importable from here as before).
The model learns only what the assistant says: the targets are the next token at assistant positions
and −100 (ignored by the loss) everywhere else, so the mean loss is

    L = − 1/|A| Σ_{t ∈ A} log p(x_{t+1} | x_{≤t}),   A = the positions whose next token is the assistant's.

A reply's tokens are found by rendering the conversation up to each reply twice: before it with the
generation prompt (``… <|im_start|>assistant\\n``) and with it; the difference is the reply and its
end-of-turn marker (``content<|im_end|>\\n``), which the model must learn to say so that it stops. The
pieces are tokenized one by one and concatenated, as a server tokenizes a prompt and then generates.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor

from .. import jsonio
from ..errors import DataError
from ..tokens.chat import END_OF_TURN, ROLES, chat_stop_strings, check_messages, render_chat  # re-exported: old home
from .spec import DataSpec, register_data

__all__ = ["ChatConversations", "ChatExample", "ChatBatches", "read_chats", "render_chat", "encode_chat",
           "check_messages", "chat_stop_strings", "is_chat_file", "ROLES", "END_OF_TURN"]

IGNORE = -100


@dataclass
class ChatExample:
    """One rendered conversation: token ids ``(n,)`` and per-token flags ``(n,)``, True where the assistant speaks."""

    ids: Tensor
    assistant: Tensor

    def __len__(self) -> int:
        return len(self.ids)


def encode_chat(tokenizer, messages: list[dict[str, str]], where: str = "conversation") -> ChatExample:
    """Tokenize a conversation and mark the assistant's tokens (see the module docstring)."""
    def render(upto: int, add_generation_prompt: bool) -> str:
        try:
            return render_chat(tokenizer, messages[:upto], add_generation_prompt=add_generation_prompt)
        except DataError as err:  # the template's own error, prefixed with the conversation's line
            raise DataError(f"{where}: {err}") from None

    pieces: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(i, True)
        after = render(i + 1, False)
        if not (before.startswith(done) and after.startswith(before)):
            raise DataError(f"{where}: the chat template does not render this conversation incrementally "
                            "(a prefix of it renders differently), so its replies cannot be located")
        pieces += [(before[len(done):], False), (after[len(before):], True)]
        done = after
    if not pieces:
        raise DataError(f"{where}: the conversation has no assistant message (nothing to learn)")
    rest = render(len(messages), False)
    if rest.startswith(done) and len(rest) > len(done):
        pieces.append((rest[len(done):], False))
    # A tokenizer that adds specials to every text (Llama's leading <s>) adds them to the first piece only.
    added = tokenizer.encode("")
    ids: list[int] = []
    flags: list[bool] = []
    for text, is_reply in pieces:
        if not text:
            continue
        piece_ids = tokenizer.encode(text)
        if ids and added and piece_ids[: len(added)] == added:
            piece_ids = piece_ids[len(added):]
        ids += piece_ids
        flags += [is_reply] * len(piece_ids)
    return ChatExample(torch.tensor(ids, dtype=torch.long), torch.tensor(flags, dtype=torch.bool))


def read_chats(path: str | Path, tokenizer) -> list[ChatExample]:
    """Read a JSON-lines chat file; a malformed record is a DataError naming its line number."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"chat file {path} does not exist")
    examples = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not UTF-8 text (invalid byte at offset {err.start})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            record = jsonio.loads(line, what=where)  # nested too deep: a JSONTooDeep line naming the line
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not a JSON object ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict) or "messages" not in record:
            raise DataError(f"{where}: expected an object with a 'messages' list")
        examples.append(encode_chat(tokenizer, check_messages(record["messages"], where), where))
    if not examples:
        raise DataError(f"{path} holds no conversations")
    return examples


class ChatBatches:
    """Batches of conversations for next-token training with the loss on the assistant's tokens.

    ``batch(i)`` draws ``batch_size`` conversations with a generator seeded by ``(seed, i)`` (a pure function of
    ``i``, so resume is exact), cuts each to ``block_size + 1`` tokens, and pads to the longest: inputs
    ``(B, T)`` padded with ``pad_id``, targets ``(B, T)`` = the next token where the assistant speaks, −100
    elsewhere (padding included). Causal attention never lets a real position see the padding after it.

    Args:
        examples: from :func:`read_chats`.
        block_size: the model's context T.
        batch_size: B.
        pad_id: the token fed at padded positions (any id; its targets are ignored).
        seed: the data seed.
    """

    def __init__(self, examples: list[ChatExample], block_size: int, batch_size: int, *, pad_id: int = 0,
                 seed: int = 0):
        self.examples = [example for example in examples if bool(example.assistant[1 : block_size + 1].any())]
        if not self.examples:
            raise DataError(f"no conversation has an assistant token within the first {block_size} tokens; "
                            "use a longer block_size or shorter conversations")
        self.block_size, self.batch_size, self.pad_id, self.seed = block_size, batch_size, pad_id, seed

    def __len__(self) -> int:
        return len(self.examples)

    def collate(self, chosen: list[ChatExample]) -> tuple[Tensor, Tensor]:
        """Pad conversations into ``(inputs (B, T), targets (B, T))``."""
        cut = [(example.ids[: self.block_size + 1], example.assistant[: self.block_size + 1]) for example in chosen]
        T = max(len(ids) for ids, _ in cut) - 1
        x = torch.full((len(cut), T), self.pad_id, dtype=torch.long)
        y = torch.full((len(cut), T), IGNORE, dtype=torch.long)
        for row, (ids, flags) in enumerate(cut):
            n = len(ids) - 1
            x[row, :n] = ids[:-1]
            y[row, :n] = torch.where(flags[1:], ids[1:], IGNORE)  # predict token t+1 only if the assistant says it
        return x, y

    def batch(self, index: int) -> tuple[Tensor, Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        pick = torch.randint(len(self.examples), (self.batch_size,), generator=generator)
        return self.collate([self.examples[int(i)] for i in pick])

    def eval_batches(self) -> list[tuple[Tensor, Tensor]]:
        """Every conversation once, in order, in batches (for a validation loss over all of them)."""
        return [self.collate(self.examples[i : i + self.batch_size])
                for i in range(0, len(self.examples), self.batch_size)]


def is_chat_file(source: str | None) -> bool:
    """Whether a ``--data`` value is a chat file: a ``.jsonl`` file whose first record has ``messages``."""
    if not source or not str(source).endswith(".jsonl") or not Path(source).is_file():
        return False
    with open(source, encoding="utf-8", errors="replace") as file:
        for line in file:
            if line.strip():
                try:
                    record = jsonio.loads(line)
                    return isinstance(record, dict) and "messages" in record
                except (json.JSONDecodeError, jsonio.JSONTooDeep):
                    return True  # a malformed chat file: read_chats names the line
    return False


@register_data
@dataclasses.dataclass
class ChatConversations(DataSpec):
    """A chat file for fine-tuning: the conversations of ``source``, a seeded ``val_fraction`` of them held out
    (at least one) to validate on."""

    kind: ClassVar[str] = "chats"
    source: str = ""
    val_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self):
        if not 0 < self.val_fraction < 1:
            raise DataError(f"val_fraction must be in (0, 1), got {self.val_fraction}")

    def split(self, tokenizer) -> tuple[list[ChatExample], list[ChatExample]]:
        """``(training, validation)`` conversations, encoded with ``tokenizer``."""
        examples = read_chats(self.source, tokenizer)
        if len(examples) < 2:
            raise DataError(f"{self.source} holds {len(examples)} conversation; fine-tuning needs at least 2 "
                            "(one to validate on)")
        order = list(range(len(examples)))
        random.Random(f"chats-{self.seed}").shuffle(order)
        n_val = max(1, int(len(examples) * self.val_fraction))
        return [examples[i] for i in sorted(order[n_val:])], [examples[i] for i in sorted(order[:n_val])]

    def held_out(self, tokenizer) -> list[ChatExample]:
        """The validation conversations."""
        return self.split(tokenizer)[1]
