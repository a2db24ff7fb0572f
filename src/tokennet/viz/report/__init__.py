"""One page per run: ``RUN_DIR/report.html`` with settings, curves, and what the task's model does.

``tokennet report RUN_DIR`` writes it, and training writes it at every checkpoint (curves only: the
model is not saved yet) and at the end (everything). The page is one self-contained HTML5 file —
CSS inline, pictures as PNG data URIs, no script — so it reads offline and survives being mailed.

What every run shows (the *core*, this module): the run's status, wall time, parameter count and
throughput; ``metrics.json`` exactly as stored; the curves of ``log.jsonl`` (loss against steps and
against seconds, learning rate, gradient norm, evaluation metrics); the command that reproduces the
run with the settings that differ from the recipe's defaults highlighted; the machine.

What a task shows comes from its *panel*, which the task declares (:meth:`tokennet.tasks.Task.panel`)::

    def panel(self, run: Run, log: LogData) -> list[(heading, html)]

The core does not change for a new task. :func:`register_panel` (kept from before tasks declared their
panels) replaces the panel of a task kind. Attention pictures in panels come from the task's pictures
(:func:`viz_pictures`): the report does not redraw what ``tokennet viz`` draws.

Bad input never gives a traceback: a directory that is not a run is a :class:`~tokennet.errors.RunError`;
a run with no ``log.jsonl`` gets a page that says training has not logged anything yet; lines of
``log.jsonl`` that do not parse are skipped, counted and listed on the page.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import platform
import shlex
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import RunError, TokennetError
from ...fileio import atomic_write_text
from ...run import LOG_FILE, METRICS_FILE, REPORT_FILE, read_metrics, read_run_info
from .curves import curve_figures
from .html import Section, esc, note, number, page, section, table
from .logs import LogData, read_log

__all__ = ["write_report", "build_report", "register_panel", "list_panels", "viz_pictures", "CheckpointReports",
           "REPORT_FILE",
           "LogData", "read_log"]

log = logging.getLogger(__name__)

Panel = Callable[..., list[Section]]
_PANELS: dict[str, Panel] = {}

# Panel failures that are the data's or the run's (a moved corpus, an old run.json), shown on the page.
_EXPECTED = (TokennetError, OSError, ValueError, KeyError)


def register_panel(kind: str, fn: Panel) -> None:
    """Replace the report panel of a task kind with ``fn(run, log) -> [(heading, html), ...]``."""
    _PANELS[kind] = fn


def list_panels() -> list[str]:
    """The task kinds with a report panel: every registered task that declares one."""
    from ...plugins import list_tasks

    return sorted({task.kind for task in list_tasks().values() if task.declares("panel")} | set(_PANELS))


def viz_pictures(run, **options) -> list[tuple[str, bytes]]:
    """The PNGs the task's pictures draw for ``options``, as ``(file name, bytes)``."""
    from .. import _VIZ

    draw = _VIZ.get(run.task.kind, run.task.draw)
    with tempfile.TemporaryDirectory(prefix="tokennet-report-") as tmp:
        return [(png.name, png.read_bytes()) for png in draw(run, Path(tmp), **options)]


# -- the core sections ----------------------------------------------------------------------------------
def _task_of(info: dict[str, Any]) -> tuple[str, str]:
    """``(task name, task kind)`` of a run from its model preset (no weights needed)."""
    from ...models.registry import preset_info
    from ...plugins import task_for

    try:
        family = preset_info(info.get("model", ""))[0]
    except (TokennetError, KeyError, ValueError):
        return "model", "model"
    task = task_for(family)
    return (task.name, task.kind) if task is not None else ("model", "model")


def _fact(key: str, value_html: str) -> str:
    return f'<div class="fact"><div class="k">{esc(key)}</div><div class="v">{value_html}</div></div>'


def _duration(seconds: float) -> str:
    secs = int(round(seconds))
    if secs >= 3600:
        return f"{secs // 3600}h {secs // 60 % 60:02d}m {secs % 60:02d}s"
    return f"{secs // 60}m {secs % 60:02d}s"


def _facts(metrics: dict[str, Any], data: LogData) -> str:
    facts = []
    last = (data.evals or data.train or [{}])[-1]
    step = metrics.get("step", last.get("step"))
    if step is not None:
        facts.append(_fact("steps", number(step, "step" if "step" in metrics else None)))
    if "wall_seconds" in metrics:
        wall = metrics["wall_seconds"]
        facts.append(_fact("wall time", f"{number(wall, 'wall_seconds')} s <small>({_duration(wall)})</small>"))
    elif "elapsed" in last:
        facts.append(_fact("training time so far", f"{esc(last['elapsed'])} s"))
    if "num_parameters" in metrics:
        n = metrics["num_parameters"]
        facts.append(_fact("parameters", f"{number(n, 'num_parameters')} <small>({n / 1e6:.3g} M)</small>"))
    rates = [record["items_per_s"] for record in data.train if isinstance(record.get("items_per_s"), (int, float))
             and record["items_per_s"] > 0]
    if rates:
        facts.append(_fact("throughput (median)", f"{statistics.median(rates):,.0f} items/s"))
    return f'<div class="facts">{"".join(facts)}</div>'


def _flat(metrics: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``metrics.json`` as ``(dotted key, value)`` pairs: nested objects become ``key.sub``."""
    out = []
    for key, value in metrics.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _metrics_table(metrics: dict[str, Any]) -> str:
    rows, longer = [], []
    for key, value in _flat(metrics):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            rows.append([f"<code>{esc(key)}</code>", number(value, key)])
        elif isinstance(value, (str, bool)) and len(str(value)) <= 80 and "\n" not in str(value):
            rows.append([f"<code>{esc(key)}</code>", esc(value)])
        else:
            longer.append(key)
    extra = f"<p class=\"sub\">Not shown here: {esc(', '.join(longer))} (text or lists; see metrics.json)."\
        "</p>" if longer else ""
    return table(["metric", "value (as in metrics.json)"], rows, num_cols=(1,)) + extra


def _set_value(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _settings(info: dict[str, Any], run_dir: Path, defaults: dict[str, Any] | None) -> str:
    settings = info.get("settings", {})
    changed = {key: value for key, value in settings.items()
               if defaults is not None and (key not in defaults or defaults[key] != value)}
    cmd = ["tokennet", "train", str(info.get("recipe", "?"))]
    if info.get("init"):
        cmd += ["--init", str(info["init"])]
    if info.get("data"):
        cmd += ["--data", str(info["data"])]
    cmd += ["--out", str(run_dir)]
    if changed:
        cmd += ["--set", *(f"{key}={_set_value(value)}" for key, value in changed.items())]
    parts = [f"<h3>Command</h3><pre>{esc(shlex.join(cmd))}</pre>"]
    if defaults is None:
        parts.append(note("The recipe's defaults are not known here, so every setting is listed without a "
                          "comparison (the command above sets none)."))
    else:
        parts.append('<p class="sub">Rebuilt from <code>run.json</code>: the settings that differ from the recipe '
                     "defaults (highlighted below) are passed with <code>--set</code>.</p>")
    rows, classes = [], []
    for key in sorted(settings, key=lambda name: (name not in changed, name)):
        default = "" if defaults is None else \
            (esc(repr(defaults[key])) if key in defaults else "<em>not a default</em>")
        rows.append([f"<code>{esc(key)}</code>", f"<code>{esc(repr(settings[key]))}</code>", default])
        classes.append("changed" if key in changed else "")
    n = len(changed)
    head = f"{len(settings)} settings" + ("" if defaults is None else f", {n} changed from the recipe defaults")
    parts.append(f"<details {'open' if n else ''}><summary>{esc(head)}</summary>"
                 + table(["setting", "this run", "recipe default"], rows, classes) + "</details>")
    return "".join(parts)


def _machine() -> str:
    import torch

    rows = [["platform", esc(platform.platform())], ["Python", esc(platform.python_version())],
            ["PyTorch", esc(torch.__version__)], ["CPU cores", esc(os.cpu_count())],
            ["torch threads", esc(torch.get_num_threads())]]
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        rows.append(["GPUs", esc(", ".join(names))])
    return ('<p class="sub">The machine that wrote this page (at the end of training, the one that trained).</p>'
            + table(["", ""], rows))


def _log_problems(data: LogData) -> str:
    if not data.skipped:
        return ""
    lines = ", ".join(str(n) for n in data.skipped[:20]) + (" …" if len(data.skipped) > 20 else "")
    return note(f"<strong>{len(data.skipped)} line(s) of {LOG_FILE} could not be read and were skipped</strong> "
                f"<span data-skipped=\"{len(data.skipped)}\"></span>(line {esc(lines)}): not a JSON record with a "
                "step. The curves show the other lines.", "warn")


def _panel_sections(run, data: LogData) -> list[Section]:
    from ...device import one_thread

    panel = _PANELS.get(run.task.kind, run.task.panel)
    if run.task.kind not in _PANELS and not run.task.declares("panel"):
        return [(run.task.name, note(f"No report panel is declared for {esc(run.task.kind)!s} runs."))]
    try:
        # Panels run small batches and token-by-token decoding: on a CPU that is latency-bound, and extra
        # threads only add synchronisation (15× slower measured on a busy 2-core machine).
        with one_thread():
            return panel(run, data)
    except _EXPECTED as err:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        log.warning("report: the %s panel could not be drawn: %s", run.task.kind, msg)
        return [(run.task.name, note(f"This panel could not be drawn: {esc(msg)}", "warn"))]


def build_report(run_dir: str | Path, *, defaults: dict[str, Any] | None = None, panels: bool = True,
                 device: str = "cpu") -> str:
    """The report page of a run directory as an HTML string.

    Args:
        run_dir: a run directory (``run.json``); a finished one has a model to show.
        defaults: the recipe's default settings (``Recipe.defaults(data)``), for the settings diff.
        panels: draw the task's panel (needs the saved model; False during training).
        device: where to run the model for the panel.
    """
    run_dir = Path(run_dir)
    info = read_run_info(run_dir)  # RunError when it is not a run
    metrics = read_metrics(run_dir)
    data = read_log(run_dir / LOG_FILE)
    task_name, _ = _task_of(info)
    finished = (run_dir / METRICS_FILE).is_file()
    if not data.exists or data.empty:
        status = "training has not logged anything yet"
    elif finished:
        status = "finished"
    else:
        status = f"in progress or interrupted (last logged step {(data.train + data.evals)[-1]['step']})"
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [f"<h1>{esc(run_dir.resolve().name)}: {esc(info.get('recipe', '?'))} run</h1>",
            f'<p class="sub">{esc(task_name)} · model preset <code>{esc(info.get("model", "?"))}</code> · data '
            f'<code>{esc(info.get("data") or "the recipe default")}</code> · <strong data-status>{esc(status)}'
            f"</strong> · page written {esc(now)}</p>", _log_problems(data)]
    if not data.exists or data.empty:
        body.append(note(f"Training has not logged anything yet: <code>{LOG_FILE}</code> "
                         f"{'is empty' if data.exists else 'does not exist'}. The page fills in at the next "
                         "checkpoint; run <code>tokennet report</code> again to refresh it."))
    body.append(_facts(metrics, data))
    if metrics:
        body.append(section("Metrics", _metrics_table(metrics), "metrics"))
    figs, notes = curve_figures(data)
    if figs or notes:
        body.append(section("Training curves", "".join(note(esc(n)) for n in notes)
                            + f'<div class="plots">{"".join(figs)}</div>', "curves"))
    if panels and finished:
        from ...run import load

        run = load(run_dir, device=device)
        for title, html in _panel_sections(run, data):
            body.append(section(title, html))
    elif not finished and data.exists:
        body.append(note("The model's samples and predictions appear here when training finishes."))
    body.append(section("Command and settings", _settings(info, run_dir, defaults), "settings"))
    body.append(section("Machine", _machine(), "machine"))
    return page(f"{run_dir.resolve().name} — tokennet report", "\n".join(part for part in body if part))


def write_report(run_dir: str | Path, out: str | Path | None = None, **kw) -> Path:
    """Write the report (default ``RUN_DIR/report.html``) atomically and return its path.

    The page is built first and then renamed into place, so a reader (or an interrupted run) always has
    the last whole page. Keyword arguments go to :func:`build_report`.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir} is not a run directory (it does not exist or is not a directory)")
    path = Path(out) if out is not None else run_dir / REPORT_FILE
    if path.is_dir():
        raise RunError(f"{path} is a directory; give a file name for the report")
    if not path.parent.is_dir():
        raise RunError(f"cannot write {path}: the directory {path.parent} does not exist")
    return atomic_write_text(path, build_report(run_dir, **kw))


class CheckpointReports:
    """``Trainer(on_checkpoint=...)``: refresh the curves page at checkpoints, at most every ``min_interval``
    seconds and never spending more than a tenth of the time on it (checkpoints may come every step); a
    stopping run (Ctrl-C, SIGTERM) always gets its page. ``write`` is the function that writes it."""

    def __init__(self, write: Callable[[], Any], min_interval: float = 30.0):
        self.write, self.min_interval = write, min_interval
        self._next = 0.0  # time.monotonic() after which the next checkpoint refreshes the page

    def __call__(self, trainer) -> None:
        import time

        now = time.monotonic()
        if now < self._next and not getattr(trainer, "stopping", False):
            return
        self.write()
        took = time.monotonic() - now
        self._next = time.monotonic() + max(self.min_interval, 10 * took)

