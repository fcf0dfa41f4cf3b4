"""Small JSON records in run and matrix folders, each described once: the fields, their
types and ranges. The writer checks a record against its description before it writes
it, and every reader checks what it reads against the same description, so a record
that was planted, edited or damaged reads as what it is (refused, or left out), never
as a figure on a page, a line of a report or a traceback.

The descriptions here are of the records whose readers are many (status.json's cell
entries, extensions.json's grid points, a one-shot pruning result). The larger files
have a reader of their own beside their writer, with the same rule: plan.yaml
(gpt2/matrix/plan_file.py), summary.json (gpt2/run_folder.py), config.json
(gpt2/config/options.py from_record), provenance.json (gpt2/training/provenance.py),
a Slurm jobs.json (gpt2/matrix/slurm_backend.py), meta.json (gpt2/data/loader.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Field:
    """One field of a record: its type (a float field takes an int too), its range
    (inclusive), the values it may take, and whether a record needs it."""

    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    required: bool = False
    finite: bool = True  # False: NaN and the infinities are figures too (a diverged loss)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not one this field holds; None if it is (None itself is
        "not known", which every optional field may be)."""
        if value is None:
            return "missing" if self.required else None
        kinds = (int, float) if self.kind is float else (self.kind,)
        if isinstance(value, bool) is not (self.kind is bool) or not isinstance(value, kinds):
            return f"{_short(value)} is not a {self.kind.__name__}"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**63:
            return f"{_short(value)} is past any number kgpt writes"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                if isinstance(value, float) and not math.isfinite(value):
                    return f"{_short(value)} is not a finite number" if self.finite else None
                if self.low is not None and value < self.low:
                    return f"{_short(value)} is below {self.low:g}"
                if self.high is not None and value > self.high:
                    return f"{_short(value)} is above {self.high:g}"
            except OverflowError:  # (an int of hundreds of digits)
                return f"{_short(value)} is past any number kgpt writes"
        if self.choices and value not in self.choices:
            return f"{_short(value)} is not one of {', '.join(self.choices)}"
        return None


def problem(record: Any, fields: Mapping[str, Field]) -> str | None:
    """Why ``record`` is not a record of ``fields``; None if it is. Keys it does not
    describe are not judged (a later version's additions)."""
    if not isinstance(record, dict):
        return f"a {type(record).__name__}, not an object"
    for name, field in fields.items():
        why = field.problem(record.get(name))
        if why:
            return f"{name}: {why}"
    return None


def kept(record: dict[str, Any], fields: Mapping[str, Field]) -> dict[str, Any]:
    """``record`` less the described fields it holds wrongly (for a record that is only
    a history, where a bad field costs itself and not the record)."""
    return {k: v for k, v in record.items() if k not in fields or fields[k].problem(v) is None}


def finite_or_none(value: Any) -> Any:
    """``value`` as JSON can hold it: NaN and the infinities, also inside lists and
    objects, become null (JSON has no word for them: Python would write NaN, which
    other readers refuse)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
