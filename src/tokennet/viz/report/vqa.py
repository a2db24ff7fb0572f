"""The report panel of question-answering runs: the transformer against the CNNs per question template,
held-out questions with the model's answers, the misses, and where the question looks."""

from __future__ import annotations

from pathlib import Path

from .html import Section, esc, img, inline_img, number, table

__all__ = ["vqa_panel"]

ROWS = 12
MISSES = 4

MODELS = (("", "transformer"), ("cnn_", "CNN (FiLM, full receptive field)"),
          ("shallow_cnn_", "shallow CNN (FiLM, local receptive field)"))


def _cell(metrics, key: str) -> str:
    return number(metrics[key], key) if key in metrics else "—"


def _comparison(run) -> str:
    m = run.metrics
    templates = sorted({k[len("exact_match_"):] for k in m if k.startswith("exact_match_")
                        and isinstance(m[k], (int, float))})
    shown = [(prefix, name) for prefix, name in MODELS if f"{prefix}exact_match" in m]
    rows = [[f"<code>{esc(template)}</code>", *(_cell(m, f"{prefix}exact_match_{template}") for prefix, _ in shown)]
            for template in templates]
    rows.append(["<b>all</b>", *(_cell(m, f"{prefix}exact_match") for prefix, _ in shown)])
    head = ["template", *(esc(n) for _, n in shown)]
    body = '<p class="sub">Exact match (%) on the held-out test questions (metrics.json).'
    if "cnn_exact_match" in m:
        body += " The CNNs answer the same questions after the same number of steps, with about the same " \
                "parameter budget."
    fields = [f"{name}: {_cell(m, prefix + 'receptive_field')} px" for prefix, name in shown[1:]
              if f"{prefix}receptive_field" in m]
    if fields:
        body += " Receptive field of one unit of the last feature map: " + "; ".join(fields) + " (the image is " \
                f"{run.model.config.image_size} px)."
    body += "</p>" + table(head, rows, num_cols=tuple(range(1, len(head))))
    if "attention_mass_ratio" in m:
        per = ", ".join(f"{esc(k[len('attention_mass_ratio_'):])} {_cell(m, k)}" for k in sorted(m)
                        if k.startswith("attention_mass_ratio_"))
        body += (f'<p class="sub">Where the question looks: on questions about one or two objects, the question\'s '
                 f"summary token puts {_cell(m, 'attention_mass')} of its (rolled-out) attention to the image on "
                 f"them, which cover {_cell(m, 'attention_object_share')} of it: "
                 f"{_cell(m, 'attention_mass_ratio')}× their share (1× would be looking everywhere alike). By "
                 f"template (all questions) and by layer: {per}.</p>")
    if "attention_vs_other_animals" in m:
        per = ", ".join(f"{esc(k[len('attention_vs_other_animals_'):])} {_cell(m, k)}" for k in sorted(m)
                        if k.startswith("attention_vs_other_animals_"))
        body += (f'<p class="sub">Against the other animals (the control a question-blind model fails): the mass '
                 f"on one asked animal is {_cell(m, 'attention_vs_other_animals')}× the mass on one of the picture's "
                 f"other animals (1× = looking at every animal alike, whatever was asked); by template and layer: "
                 f"{per}. Of the question's attention, {_cell(m, 'attention_image_share')} goes to the image at "
                 "all (the rest to its words and the sink).</p>")
    if "sink_vs_inverse_count_r" in m:
        counts = sorted(int(k[len("sink_weight_k"):]) for k in m if k.startswith("sink_weight_k"))
        curve = ", ".join(f"k={k}: {_cell(m, f'sink_weight_k{k}')} (1/(k+1) = {1 / (k + 1):.3f})" for k in counts)
        body += (f'<p class="sub">The learned counter: the head whose weight on the sink tracks 1/(k+1) best '
                 f"(layer.head {_cell(m, 'sink_head')}, r = {_cell(m, 'sink_vs_inverse_count_r')}) puts on it "
                 f"{curve} — the hand-built counter (tokennet demo counting) puts exactly 1/(k+1).</p>")
    if "patch_grouping_ratio" in m:
        body += (f'<p class="sub">Objects group themselves: a patch token of an animal puts '
                 f"{_cell(m, 'patch_grouping_ratio')}× their share of its attention on its own animal's other "
                 "patches (the best layer; 1× = blind to objects).</p>")
    if "head_distance_min" in m:
        grouping = (f"; the head that groups most puts {_cell(m, 'head_grouping_max')}× their share on its own "
                    "animal's other patches" if "head_grouping_max" in m else "")
        body += (f'<p class="sub">Head by head (the ViT paper\'s mean attention distance: how far in the picture a '
                 f"patch's attention reaches, weighted by it): from {_cell(m, 'head_distance_min')} px to "
                 f"{_cell(m, 'head_distance_max')} px{grouping}. Per layer and head: <code>head_distance_layer"
                 "&lt;ℓ&gt;_head&lt;h&gt;</code> in metrics.json, and <code>attention_heads.png</code> below.</p>")
    return body


def _thumb(x) -> str:
    from .sequences import _png_of_image

    return inline_img(_png_of_image(x, scale=2), "held-out image")


def vqa_panel(run) -> list[Section]:
    from . import viz_pictures

    test = run.data.held_out()
    n = min(ROWS, len(test))
    got = run.answer(test.images[:n], test.questions[:n])
    want = [run.data.answers[int(answer_id)] for answer_id in test.answers[:n]]
    rows, classes = [], []
    for i in range(n):
        rows.append([str(i), _thumb(test.images[i]), esc(test.questions[i]), f"<code>{esc(test.templates[i])}</code>",
                     esc(want[i]), esc(got[i])])
        classes.append("hit" if got[i] == want[i] else "miss")
    held = (f'<p class="sub">{sum(ans == ref for ans, ref in zip(got, want, strict=True))} of the first {n} held-out '
            "questions right.</p>" + table(["#", "image", "question", "template", "answer", "model"], rows, classes,
                                           col_classes={-1: "out"}))
    out = [("Answers by question template", _comparison(run)), ("Held-out questions", held)]

    # Misses: the first few wrong answers among the held-out questions, with where the question looked.
    limit = min(len(test), 400)
    all_got = run.answer(test.images[:limit], test.questions[:limit])
    wrong = [i for i in range(limit) if all_got[i] != run.data.answers[int(test.answers[i])]][:MISSES]
    if wrong:
        pics = "".join(img(png, f"miss #{i}", f"held-out #{i} (tokennet viz --index {i})")
                       for i in wrong for _, png in viz_pictures(run, index=i))
        miss = (f'<p class="sub">{len(wrong)} of the wrong answers among the first {limit} held-out questions.</p>'
                f'<div class="plots">{pics}</div>')
    else:
        miss = f'<p class="sub">No wrong answer among the first {limit} held-out questions.</p>'
    out.append(("Misses", miss))
    pics = "".join(img(png, name, "one held-out question per template (tokennet viz)", cls="wide")
                   for name, png in viz_pictures(run))
    out.append(("Where the question looks", pics))
    sweep = _receptive_field(run)
    if sweep:
        out.append(("Corner pairs against the receptive field", sweep))
    return out


SWEEP = "receptive_field.json"


def _receptive_field(run) -> str:
    """The sweep of ``bench/vqa_receptive_field.py --into RUN`` (``receptive_field.json`` and ``.png`` in the run
    directory), when it was run: corner-pair accuracy of CNNs with growing receptive fields beside the
    transformer."""
    from ... import jsonio

    path = Path(run.path) / SWEEP
    if not path.is_file():
        return ""
    try:
        sweep = jsonio.load(path)
        rows = [[esc(row["model"]), str(row["receptive_field"]), str(row["layers"]), str(row["num_parameters"]),
                 f"{row['same_species']:.1f}", f"{row['species']:.1f}"] for row in sweep["rows"]]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):  # JSONTooDeep is a ValueError
        return f'<p class="sub">{esc(SWEEP)}: this report cannot read it as a sweep.</p>'
    settings = sweep["settings"] if isinstance(sweep.get("settings"), dict) else {}  # a damaged file: no settings
    body = (f'<p class="sub">Is the top right animal the same species as the bottom left one? FiLM CNNs whose units '
            f"see more and more of the 64-pixel picture (coordinate channels, so that pooling is not what fails), "
            f"beside the transformer, trained on the same corner questions for {settings.get('steps', '?')} steps; "
            f"held-out test, chance 50 % (<code>{esc(sweep.get('command', ''))}</code>, commit "
            f"{esc(str(sweep.get('commit', '?')))}).</p>")
    body += table(["model", "field (px)", "layers", "params", "same species %", "species %"], rows,
                  num_cols=(1, 2, 3, 4, 5))
    png = path.with_suffix(".png")
    if png.is_file():
        body += img(png.read_bytes(), "corner pairs vs receptive field")
    return body
