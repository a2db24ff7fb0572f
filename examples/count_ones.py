"""A task of your own, in one file: "how many ones are in this bit string?", as a tokennet plugin.

The lecture's counting question on the smallest possible input: each bit is a token, a ``<cls>`` token
attends over them, and its output says how many of them are 1. This file declares everything tokennet
needs, with nothing changed in tokennet:

- a **data spec** (:class:`BitStrings`): what the data is, saved with every run;
- a **model family** (``bit-counter``): a token embedding, learned positions and tokennet's own
  :class:`~tokennet.layers.stack.Encoder`;
- a **task** (:class:`BitCounting`): the verb ``run.count(bits)``, the input ``--bits`` of ``tokennet
  generate``, held-out strings for ``tokennet examples``, the pictures of ``tokennet viz`` and the report's panel;
- a **recipe** (``count-ones``): which data, which model, which settings, which metrics.

Use it with every command::

    tokennet --plugin examples/count_ones.py train count-ones --out runs/count-ones    # ~20 s on 2 cores
    tokennet --plugin examples/count_ones.py eval runs/count-ones
    tokennet --plugin examples/count_ones.py generate runs/count-ones --bits 0110100111010001
    tokennet --plugin examples/count_ones.py viz runs/count-ones
    tokennet --plugin examples/count_ones.py report runs/count-ones

or install it as a package with an entry point (``[project.entry-points."tokennet.plugins"] count_ones =
"count_ones"``) and drop ``--plugin``. In Python: ``import count_ones, tokennet; run =
tokennet.load("runs/count-ones"); run.count("0110")``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from tokennet.data.spec import DataSpec, register_data
from tokennet.errors import ConfigError, DataError
from tokennet.layers.stack import Encoder
from tokennet.lifecycle import BuildContext, Job, Recipe, register_recipe
from tokennet.models.registry import ModelConfig, Output, create_model, register_family, register_preset
from tokennet.tasks import Example, Input, Task, register_task, take, verb


# -- the data --------------------------------------------------------------------------------------------
@register_data
@dataclasses.dataclass
class BitStrings(DataSpec):
    """Random bit strings of ``length`` bits; the label is how many are 1. Training draws fresh strings per
    batch from ``(seed, batch index)``; the ``test_size`` test strings come from their own seed.

    Args:
        seed: draws the training and the test strings.
        length: bits per string (the model's ``length`` follows it).
        test_size: held-out strings the accuracy is measured on.
    """

    kind: ClassVar[str] = "bit-strings"
    seed: int = 0
    length: int = 16
    test_size: int = 512

    def draw(self, n: int, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(random.Random(f"{self.seed}-{key}").randrange(2**62))
        x = torch.randint(0, 2, (n, self.length), generator=g)  # (n, L) bits
        return x, x.sum(1)

    def held_out(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.draw(self.test_size, "test")


class BitBatches:
    """The trainer's batch source: batch ``i`` is a pure function of ``i`` (exact resume)."""

    def __init__(self, spec: BitStrings, batch_size: int):
        self.spec, self.batch_size = spec, batch_size

    def batch(self, index: int):
        return self.spec.draw(self.batch_size, f"train-{index}")


# -- the model ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class BitCounterConfig(ModelConfig):
    """The bit counter's settings.

    Args:
        length: bits per string, one token each (set by the data).
        dim: width D of every token vector.
        num_layers: encoder blocks L.
        num_heads: attention heads H.
    """

    length: int = 16
    dim: int = 32
    num_layers: int = 1
    num_heads: int = 2

    def __post_init__(self):
        self.family = "bit-counter"
        self._positive(length=self.length, dim=self.dim, num_layers=self.num_layers, num_heads=self.num_heads)
        if self.dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide dim={self.dim}")


class BitCounter(nn.Module):
    """``<cls> b_1 … b_L`` → the count of ones, read from ``<cls>``: tokens (a bit is a token), positions,
    one generic encoder, a head."""

    def __init__(self, config: BitCounterConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(3, c.dim)  # 0, 1 and <cls> (= 2)
        self.pos_emb = nn.Parameter(torch.randn(c.length + 1, c.dim) * 0.02)
        self.encoder = Encoder(c.dim, c.num_layers, c.num_heads, mlp_ratio=2.0)
        self.head = nn.Linear(c.dim, c.length + 1)  # counts 0..L

    def _tokens(self, bits: torch.Tensor) -> torch.Tensor:
        cls = torch.full((len(bits), 1), 2, dtype=torch.long, device=bits.device)
        return self.tok_emb(torch.cat([cls, bits.long()], 1)) + self.pos_emb  # (B, 1 + L, D)

    def forward(self, bits: torch.Tensor, targets: torch.Tensor | None = None) -> Output:
        logits = self.head(self.encoder(self._tokens(bits))[:, 0])  # (B, L + 1)
        return Output(logits, None if targets is None else F.cross_entropy(logits, targets))

    def attention_maps(self, bits: torch.Tensor) -> dict[str, list[torch.Tensor]]:
        _, maps = self.encoder(self._tokens(bits), return_weights=True)
        return {"self": [m["self"] for m in maps]}  # per layer (B, H, 1 + L, 1 + L)

    def example_input(self, batch_size: int = 2) -> torch.Tensor:
        return torch.randint(0, 2, (batch_size, self.config.length), generator=torch.Generator().manual_seed(0))

    def example_targets(self, batch_size: int = 2) -> torch.Tensor:
        return self.example_input(batch_size).sum(1)


register_family("bit-counter", BitCounterConfig, BitCounter)
register_preset("bit-counter", "bit-counter", "counts the ones of a bit string (the count_ones plugin example)")


# -- the task: what a trained run does -------------------------------------------------------------------------
def parse_bits(text: str, length: int) -> torch.Tensor:
    bits = text.strip().replace(" ", "")
    if not bits or set(bits) - {"0", "1"} or len(bits) != length:
        raise DataError(f"give exactly {length} bits (0 or 1), got {text!r}")
    return torch.tensor([[int(b) for b in bits]])


@register_task
class BitCounting(Task):
    name = "bit counting"
    kind = "bit-counting"
    families = ("bit-counter",)
    viz_uses = ("index",)  # the `tokennet viz` flags its pictures read; any other is refused in one line
    inputs = (Input("bits", "count-ones runs: the bit string to count the ones of, e.g. 0110100111010001",
                    file=False),)

    @verb
    @torch.no_grad()
    def count(self, run, bits: str) -> int:
        """How many ones ``bits`` has, as the model reads it."""
        x = parse_bits(bits, run.model.config.length).to(run.device)
        return int(run.model(x).logits.argmax(-1))

    def respond(self, run, values: dict[str, Any]) -> Iterator[str]:
        yield f"{self.count(run, values['bits'])}\n"

    def draw(self, run, out_dir: Path, *, index: int | None = None, **_) -> list[Path]:
        """``cls_attention.png``: where <cls> looks, per layer (mean of heads), over a held-out string."""
        from tokennet.viz.attention_maps import pyplot, save_figure

        x, y = run.data.held_out()
        i = 0 if index is None else index
        if not 0 <= i < len(y):
            raise DataError(f"index {i} out of range: 0..{len(y) - 1}")
        with torch.no_grad():
            maps = run.model.attention_maps(x[i:i + 1].to(run.device))["self"]
        plt = pyplot()
        fig, axes = plt.subplots(len(maps), 1, figsize=(6, 1.6 * len(maps)), squeeze=False)
        for layer, (ax, a) in enumerate(zip(axes[:, 0], maps, strict=True)):
            ax.bar(range(x.shape[1]), a[0, :, 0, 1:].mean(0).cpu(), color=["#c33" if b else "#bbb" for b in x[i]])
            ax.set_title(f"layer {layer}: <cls> attention over the bits (red: 1)", fontsize=8)
        fig.suptitle(f"held-out string {i}: {''.join(map(str, x[i].tolist()))} — {int(y[i])} ones", fontsize=9)
        fig.tight_layout()
        return [save_figure(fig, Path(out_dir) / "cls_attention.png")]

    def panel(self, run, log) -> list[tuple[str, str]]:
        from tokennet.viz.report.html import esc, table

        x, y = run.data.held_out()
        with torch.no_grad():
            pred = run.model(x[:10].to(run.device)).logits.argmax(-1).cpu()
        rows = [[esc("".join(map(str, x[i].tolist()))), str(int(y[i])), str(int(pred[i]))] for i in range(len(pred))]
        classes = ["hit" if int(p) == int(t) else "miss" for p, t in zip(pred, y[:10], strict=True)]
        return [("Held-out strings", table(["bits", "ones", "model"], rows, classes))]

    def examples(self, run, directory: Path, count: int = 1) -> list[Example]:
        """``bits-K.txt`` per held-out string (``tokennet examples``), labelled with its count of ones."""
        x, y = run.data.held_out()
        out = []
        for k in take(count, len(y), run.path):
            bits = "".join(map(str, x[k].tolist()))
            path = Path(directory) / f"bits-{k}.txt"
            path.write_text(bits)
            out.append(Example({"bits": bits}, str(int(y[k])), (path,)))
        return out

    def bad_inputs(self, run, directory: Path) -> list[tuple[dict[str, Any], str]]:
        return [({"bits": "0120"}, "bits"), ({"bits": ""}, "bits")]


# -- the recipe: what to train --------------------------------------------------------------------------------
@torch.no_grad()
def accuracy(model, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    dev = next(model.parameters()).device
    out = model(x.to(dev), y.to(dev))
    return {"test_accuracy": float((out.logits.argmax(-1) == y.to(dev)).float().mean()), "test_loss": float(out.loss)}


def build(ctx: BuildContext) -> Job:
    spec: BitStrings = ctx.data
    ctx.from_data("length", spec.length)
    model = create_model("bit-counter", **ctx.model)
    x, y = spec.held_out()
    return Job(model=model.to(ctx.device), source=BitBatches(spec, ctx.train.batch_size),
               evaluate=lambda m: accuracy(m, x, y), tokens_per_batch=ctx.train.batch_size * spec.length)


def evaluate_run(run, data) -> dict[str, Any]:
    if data is not None:
        raise DataError("count-ones evaluates on its own held-out strings; it takes no other data")
    return accuracy(run.model, *run.data.held_out())


register_recipe(Recipe(
    name="count-ones",
    description="how many ones are in a bit string? (the plugin example, examples/count_ones.py)",
    model="bit-counter",
    build=build,
    data=BitStrings,
    train_defaults={"max_iters": 600, "batch_size": 64, "lr": 3e-3, "warmup_iters": 50, "eval_interval": 200,
                    "weight_decay": 0.01},
    evaluate_run=evaluate_run,
    smoke={"dim": 16, "batch_size": 16, "test_size": 64},
))
