"""Embedded translation data: human-written dates → ISO 8601, generated deterministically from a seed.

A source is one date written in one of :data:`FORMATS` (English, French, German and Spanish styles,
numeric conventions, upper and lower case), e.g. ``"3rd of March 1999"``, ``"Mar 3, 99"``,
``"1999/3/3"``, ``"Wednesday, March 3rd, 1999"``, ``"3 mars 1999"``; the target is ``"1999-03-03"``.

Conventions that keep every source unambiguous (so 100% exact match is attainable):

- Dates run from 1950-01-01 to 2049-12-31; a two-digit year ``yy`` means 19yy when ``yy >= 50``,
  else 20yy.
- Numeric forms: ``Y/M/D`` when the year comes first, ``M/D/Y`` (US) with slashes and the year last,
  ``D.M.Y`` with dots, ``D-M-Y`` never appears (dashes with a month name: ``3-Mar-1999``).

The held-out split is by *date*: :func:`split_dates` shuffles every date of the range with the seed
and keeps fractions apart (test, validation), so a test date never appears in training under any
format.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import ConfigError, DataError
from .spec import DataSpec, register_data

__all__ = [
    "DateTranslations",
    "FIRST_DATE",
    "LAST_DATE",
    "FORMATS",
    "format_date",
    "iso",
    "all_dates",
    "split_dates",
    "sample_pairs",
    "held_out_pairs",
    "alphabet",
    "DatePairs",
    "encode_pairs",
]

FIRST_DATE = dt.date(1950, 1, 1)
LAST_DATE = dt.date(2049, 12, 31)

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MOIS = ["janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre",
        "novembre", "décembre"]
MONATE = ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
          "November", "Dezember"]
MESES = ["enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre",
         "noviembre", "diciembre"]


def _ordinal(n: int) -> str:
    """English ordinal: 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _mon(d: dt.date) -> str:
    return MONTHS[d.month - 1][:3]


def _month(d: dt.date) -> str:
    return MONTHS[d.month - 1]


def _wd(d: dt.date) -> str:
    return WEEKDAYS[d.weekday()]


def _yy(d: dt.date) -> str:
    return f"{d.year % 100:02d}"


# Each format renders a date; the name is for documentation and per-format error reports.
FORMATS: dict[str, Callable[[dt.date], str]] = {
    "ordinal_of": lambda date: f"{_ordinal(date.day)} of {_month(date)} {date.year}",  # 3rd of March 1999
    "mon_d_yy": lambda date: f"{_mon(date)} {date.day}, {_yy(date)}",  # Mar 3, 99
    "ymd_slash": lambda date: f"{date.year}/{date.month}/{date.day}",  # 1999/3/3
    # Wednesday, March 3rd, 1999
    "weekday_long": lambda date: f"{_wd(date)}, {_month(date)} {_ordinal(date.day)}, {date.year}",
    "month_d_y": lambda date: f"{_month(date)} {date.day}, {date.year}",  # March 3, 1999
    "d_month_y": lambda date: f"{date.day} {_month(date)} {date.year}",  # 3 March 1999
    "us_slash": lambda date: f"{date.month}/{date.day}/{date.year}",  # 3/3/1999
    "us_slash_yy": lambda date: f"{date.month:02d}/{date.day:02d}/{_yy(date)}",  # 03/03/99
    "eu_dots": lambda date: f"{date.day:02d}.{date.month:02d}.{date.year}",  # 03.03.1999
    "d_mon_y_dash": lambda date: f"{date.day}-{_mon(date)}-{date.year}",  # 3-Mar-1999
    "wd_d_mon_y": lambda date: f"{_wd(date)[:3]} {date.day} {_mon(date)} {date.year}",  # Wed 3 Mar 1999
    # the 3rd of march, 1999
    "the_ordinal": lambda date: f"the {_ordinal(date.day)} of {_month(date).lower()}, {date.year}",
    "upper": lambda date: f"{_month(date).upper()} {date.day} {date.year}",  # MARCH 3 1999
    "lower_ordinal_yy": lambda date: f"{_month(date).lower()} {_ordinal(date.day)} {_yy(date)}",  # march 3rd 99
    "compact": lambda date: f"{date.year}{date.month:02d}{date.day:02d}",  # 19990303
    "iso": lambda date: date.isoformat(),  # 1999-03-03
    "french": lambda date: f"{'1er' if date.day == 1 else date.day} {MOIS[date.month - 1]} {date.year}",  # 3 mars 1999
    "german": lambda date: f"{date.day}. {MONATE[date.month - 1]} {date.year}",  # 3. März 1999
    "spanish": lambda date: f"{date.day} de {MESES[date.month - 1]} de {date.year}",  # 3 de marzo de 1999
}


def format_date(d: dt.date, fmt: str) -> str:
    """Write ``d`` in the format named ``fmt`` (a key of :data:`FORMATS`)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown date format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return FORMATS[fmt](d)


def iso(d: dt.date) -> str:
    """The target: ISO 8601 ``YYYY-MM-DD``."""
    return d.isoformat()


def all_dates() -> list[dt.date]:
    """Every date from :data:`FIRST_DATE` to :data:`LAST_DATE` (36,525 days), in order."""
    n = (LAST_DATE - FIRST_DATE).days + 1
    return [FIRST_DATE + dt.timedelta(days=i) for i in range(n)]


def split_dates(seed: int = 0, test_fraction: float = 0.1,
                val_fraction: float = 0.0) -> tuple[list[dt.date], list[dt.date], list[dt.date]]:
    """``(train, val, test)`` dates: a seeded shuffle of :func:`all_dates`, with fractions held out.

    Test and validation dates never occur in training, under any format.

    Args:
        seed: the split's seed.
        test_fraction: share of dates for the test set, in (0, 1).
        val_fraction: share of dates for validation, in [0, 1) (0 = an empty validation list).
    """
    if not 0 < test_fraction < 1 or not 0 <= val_fraction < 1 or test_fraction + val_fraction >= 1:
        raise ConfigError(f"test_fraction={test_fraction} and val_fraction={val_fraction} must be in [0, 1) "
                         "with test_fraction > 0 and a sum below 1")
    dates = all_dates()
    random.Random(f"dates-split-{seed}").shuffle(dates)
    n_test = max(1, int(len(dates) * test_fraction))
    n_val = int(len(dates) * val_fraction)
    test, val, train = dates[:n_test], dates[n_test : n_test + n_val], dates[n_test + n_val :]
    return sorted(train), sorted(val), sorted(test)


def sample_pairs(dates: Sequence[dt.date], n: int, seed: int | str, formats: Sequence[str] | None = None,
                 *, return_formats: bool = False) -> list[tuple[str, str]] | list[tuple[str, str, str]]:
    """``n`` (source, target) pairs: dates drawn from ``dates``, each in a random format.

    A pure function of its arguments (its own ``random.Random(seed)``), so batches are reproducible.

    Args:
        dates: the dates to draw from.
        n: number of pairs.
        seed: the draw's seed (an int or a string such as ``"train-0-17"``).
        formats: restrict to these formats (default: all of :data:`FORMATS`).
        return_formats: give ``(source, target, format name)`` triples.
    """
    formats = list(FORMATS) if formats is None else list(formats)
    for fmt_name in formats:
        if fmt_name not in FORMATS:
            raise ConfigError(f"unknown date format {fmt_name!r}; expected one of {', '.join(FORMATS)}")
    if not dates:
        raise DataError("no dates to sample from")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        date = dates[rng.randrange(len(dates))]
        fmt_name = formats[rng.randrange(len(formats))]
        out.append((FORMATS[fmt_name](date), iso(date), fmt_name) if return_formats
                   else (FORMATS[fmt_name](date), iso(date)))
    return out


def held_out_pairs(seed: int, n: int, test_fraction: float = 0.1,
               val_fraction: float = 0.0) -> list[tuple[str, str, str]]:
    """The held-out test set: ``n`` ``(source, target, format)`` triples over the test dates of the split."""
    _, _, test = split_dates(seed, test_fraction, val_fraction)
    return sample_pairs(test, n, f"test-{seed}", return_formats=True)


def alphabet() -> str:
    """Every character a source or target can contain, sorted (the char tokenizer's vocabulary).

    One leap year in every format covers all months, weekdays and days; digits cover all years.
    """
    chars = set("0123456789-")
    day, end = dt.date(2000, 1, 1), dt.date(2000, 12, 31)
    while day <= end:
        for render in FORMATS.values():
            chars.update(render(day))
        day += dt.timedelta(days=1)
    return "".join(sorted(chars))


def encode_pairs(pairs: Sequence[tuple[str, str]], tokenizer, pad_id: int = 0) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """Tokenize and pad ``(source, target)`` pairs into a teacher-forcing batch.

    Returns ``((src, tgt_in), tgt_out)``: ``src`` ``(B, S)`` right-padded with ``pad_id`` (the model
    turns padding into its source mask), ``tgt_in = [<bos>, y]`` and ``tgt_out = [y, <eos>]``
    ``(B, T)``, with ``tgt_out`` = -100 at padding (ignored by the loss).
    """
    srcs = [tokenizer.encode(source_ids) for source_ids, _ in pairs]
    tgts = [tokenizer.encode(target_ids) for _, target_ids in pairs]
    S = max(1, max(len(source_ids) for source_ids in srcs))
    T = max(len(target_ids) for target_ids in tgts) + 1
    B = len(pairs)
    src = torch.full((B, S), pad_id, dtype=torch.long)
    tgt_in = torch.full((B, T), pad_id, dtype=torch.long)
    tgt_out = torch.full((B, T), -100, dtype=torch.long)
    for i, (source_ids, target_ids) in enumerate(zip(srcs, tgts, strict=True)):
        src[i, : len(source_ids)] = torch.tensor(source_ids, dtype=torch.long)
        tgt_in[i, : len(target_ids) + 1] = torch.tensor([tokenizer.bos_id, *target_ids], dtype=torch.long)
        tgt_out[i, : len(target_ids) + 1] = torch.tensor([*target_ids, tokenizer.eos_id], dtype=torch.long)
    return (src, tgt_in), tgt_out


class DatePairs:
    """Batch source for the trainer: ``batch(i)`` is ``batch_size`` fresh pairs from the training dates.

    Batch ``i`` is drawn with the seed ``(seed, i)`` only, so a resumed run sees exactly the batches an
    uninterrupted one would.

    Args:
        dates: training dates.
        tokenizer: a tokenizer covering :func:`alphabet` (``CharTokenizer``).
        batch_size: pairs per batch.
        seed: the data seed.
    """

    def __init__(self, dates: Sequence[dt.date], tokenizer, batch_size: int, seed: int = 0):
        if not dates:
            raise DataError("DatePairs needs at least one date")
        self.dates, self.tokenizer, self.batch_size, self.seed = list(dates), tokenizer, batch_size, seed

    def batch(self, index: int) -> tuple[tuple[Tensor, Tensor], Tensor]:
        pairs = sample_pairs(self.dates, self.batch_size, f"train-{self.seed}-{index}")
        return encode_pairs(pairs, self.tokenizer, self.tokenizer.pad_id)


@register_data
@dataclasses.dataclass
class DateTranslations(DataSpec):
    """The date-translation data: the split of the dates (by ``seed``, fractions of the date range held out)
    and the sizes of the validation and test sets drawn from the held-out dates.

    Args:
        seed: draws the dates, their formats and the split.
        test_fraction: the share of the dates held out for the test set (never trained on).
        val_fraction: the share of the dates held out for validation.
        test_size: date pairs drawn from the test dates.
        val_size: date pairs drawn from the validation dates.
    """

    kind: ClassVar[str] = "dates"
    legacy_recipes: ClassVar[tuple[str, ...]] = ("seq2seq",)
    seed: int = 0
    test_fraction: float = 0.1
    val_fraction: float = 0.02
    test_size: int = 2000
    val_size: int = 500

    def __post_init__(self):
        if self.test_size < 1 or self.val_size < 1:
            raise ConfigError(f"test_size and val_size must be >= 1, got {self.test_size} and {self.val_size}")
        split_dates(self.seed, self.test_fraction, self.val_fraction)  # the fractions' one check

    def split(self) -> tuple[list[dt.date], list[dt.date], list[dt.date]]:
        """``(train, val, test)`` dates."""
        return split_dates(self.seed, self.test_fraction, self.val_fraction)

    def val_pairs(self) -> list[tuple[str, str]]:
        """The validation pairs (monitoring during training)."""
        return sample_pairs(self.split()[1], self.val_size, f"val-{self.seed}")

    def held_out(self) -> list[tuple[str, str, str]]:
        """The test set: ``(source, target, format)`` triples over dates training never saw."""
        return held_out_pairs(self.seed, self.test_size, self.test_fraction, self.val_fraction)
