"""The report panel of language models: samples at several temperatures, and where the model is surprised.

*Surprise* is the per-token loss ``−log p(x_t | x_<t)`` (nats) over a snippet of the run's validation
split, shaded on the text: white is a token the model saw coming, red one it found as unlikely as a
uniform guess over the vocabulary (``log V`` nats), so shades compare across runs with one tokenizer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .html import Section, esc, img, note, number

__all__ = ["language_panel", "TEMPERATURES", "per_token_loss"]

TEMPERATURES = (0.5, 0.8, 1.2)
SAMPLE_TOKENS = 160
SNIPPET_TOKENS = 256
ATTENTION_TOKENS = 24


def _samples(run) -> str:
    rows = []
    for temperature in TEMPERATURES:
        text = run.generate("\n", SAMPLE_TOKENS, temperature=temperature, seed=0)
        blank = '<p class="sub">(only white space: the model has learnt spaces and newlines first)</p>' \
            if not text.strip() else ""
        rows.append(f"<h3>temperature {temperature}</h3>{blank}<pre>{esc(text)}</pre>")
    sample = run.metrics.get("sample")
    if isinstance(sample, str):
        rows.append("<h3>the sample in metrics.json (temperature 0.8, written at the end of training)</h3>"
                    f"<pre>{esc(sample)}</pre>")
    head = (f'<p class="sub">{SAMPLE_TOKENS} tokens after a newline, seed 0: low temperatures repeat what is '
            "likely, high ones show what else the model has learnt.</p>")
    return head + "".join(rows)


@torch.no_grad()
def per_token_loss(model, ids: list[int]) -> list[float]:
    """``−log p(x_t | x_<t)`` for ``t = 1..len(ids)-1`` under the causal model (nats)."""
    dev = next(model.parameters()).device
    x = torch.tensor([ids], device=dev)
    logits = model(x[:, :-1]).logits.float()  # (1, T-1, V)
    return F.cross_entropy(logits[0], x[0, 1:], reduction="none").tolist()


def _validation_snippet(run) -> list[int]:
    block = run.model.config.block_size
    held_out = run.data.held_out
    if getattr(run.data, "kind", None) == "chats":  # fine-tuned on conversations: the validation ones, joined
        val = torch.cat([chat.ids for chat in held_out(run.tokenizer)])
    else:
        val = held_out(run.tokenizer, block)  # the validation split, as in training
    return val[: min(block, SNIPPET_TOKENS) + 1].tolist()


def _shade(loss: float, top: float) -> str:
    """White → orange → red as loss goes 0 → top/2 → top (the scale bar's gradient)."""
    level = min(max(loss / top, 0.0), 1.0)
    if level < 0.5:
        low_rgb, high_rgb, frac = (255, 255, 255), (255, 200, 120), level / 0.5
    else:
        low_rgb, high_rgb, frac = (255, 200, 120), (230, 60, 40), (level - 0.5) / 0.5
    red, green, blue = (round(x + (y - x) * frac) for x, y in zip(low_rgb, high_rgb, strict=True))
    return f"rgb({red},{green},{blue})"


def _surprise(run) -> str:
    tok, model = run.tokenizer, run.model
    ids = _validation_snippet(run)
    losses = per_token_loss(model, ids)
    top = math.log(tok.vocab_size)
    spans = [f'<span title="first token (no prediction)">{esc(tok.decode([ids[0]]))}</span>']
    for i, loss in zip(ids[1:], losses, strict=True):
        spans.append(f'<span style="background:{_shade(loss, top)}" title="loss {loss:.2f} nats, '
                     f'p = {math.exp(-loss):.3f}">{esc(tok.decode([i]))}</span>')
    mean = sum(losses) / len(losses)
    scale = (f'<div class="scale">0 nats <span class="bar"></span> {top:.2f} nats = log V (a uniform guess over '
             f"{tok.vocab_size} tokens)</div>")
    return (f'<p class="sub">The first {len(ids)} tokens of the validation split, each shaded by the loss of '
            f"predicting it from the tokens before it (hover for the value). Mean over this snippet: "
            f"{mean:.3f} nats/token (the run's <code>val_loss</code> averages many such windows).</p>"
            + scale + f'<div class="tokens mono">{"".join(spans)}</div>')


def _short_text(tok, max_tokens: int = ATTENTION_TOKENS) -> str:
    """The longest run of whole words of ``tokennet viz``'s sentence within ``max_tokens`` tokens (legible labels)."""
    from ..language import DEFAULT_TEXT

    words = DEFAULT_TEXT.split(" ")
    text = words[0]
    for word in words[1:]:
        if len(tok.encode(f"{text} {word}")) > max_tokens:
            break
        text = f"{text} {word}"
    return text


def language_panel(run, log) -> list[Section]:  # noqa: ARG001
    """Samples, per-token surprise on validation text, and the last layer's attention (from ``viz``)."""
    from . import viz_pictures

    out = [("Samples", _samples(run))]
    try:
        if run.data is None:
            raise ValueError("the run has no training data of its own (an imported checkpoint)")
        out.append(("Where the model is surprised", _surprise(run)))
    except (OSError, ValueError) as err:  # the corpus moved or changed since training
        out.append(("Where the model is surprised", note(f"The validation text could not be read: {esc(err)}",
                                                         "warn")))
    layer = run.model.config.num_layers - 1
    text = _short_text(run.tokenizer)
    pics = "".join(img(png, name, f"token-to-token attention, layer {layer} "
                       f"(tokennet viz --layer {layer} --text {text!r})", cls="wide")
                   for name, png in viz_pictures(run, layer=layer, text=text))
    if "val_loss" in run.metrics:
        pics = f'<p class="sub">val_loss {number(run.metrics["val_loss"], "val_loss")} nats/token.</p>' + pics
    out.append(("Attention", pics))
    return out

