"""plan.yaml read back: the one reader, which checks its shape before anything uses it.

gpt2/matrix/runner.py writes plan.yaml when a matrix is planned; everything after that
reads it back: the Slurm task that trains cell i (gpt2/slurm/task.py), matrix-status,
collect, the report and the pages. A plan that was edited, damaged or planted (in a
shared results folder) must never send a cell's folder outside the matrix (a cell id
``/tmp/x`` or ``../x`` once did: cells/<id> is joined onto the folder) nor end in a
traceback: each cell id is a name as kgpt makes them, each cell carries its
configuration hash and its train.py flags, and anything else is a one-line error.
status.json, each cell's record, is read here too. Light on purpose (no torch): the pages
read both.
"""

from __future__ import annotations

import math
import re
import reprlib
from pathlib import Path
from typing import Any

import yaml

from gpt2 import records, storage
from gpt2.errors import PlanFileError
from gpt2.records import Field
from gpt2.run_folder import STATES
from gpt2.config.axes import AXES
from gpt2.config.argparser import StrictArgumentParser
from gpt2.config.options import TRAIN, add_arguments, config_from_namespace

PLAN_FILE = "plan.yaml"
STATUS_FILE = "status.json"  # each cell's attempts and how it last ended
# Matrix names and cell ids, as run names are (gpt2/config/options.py): one path
# component, never "..", never hidden.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # (a path component; 128 at most)


def read_plan(folder: Path) -> dict[str, Any]:
    """``folder``/plan.yaml, checked; PlanFileError (one line) when there is none or it
    is not a plan kgpt wrote."""
    path = Path(folder) / PLAN_FILE
    data = storage.read_regular(path, limit=PLAN_LIMIT)
    if data is None and path.is_file() and path.stat().st_size > PLAN_LIMIT:
        raise PlanFileError(f"{path} is {path.stat().st_size:,} bytes, past any plan kgpt "
                            f"writes ({PLAN_LIMIT:,}): run `make test-matrix` with the "
                            "matrix's .config to write it again")
    if data is None:
        raise PlanFileError(f"{Path(folder)} has no readable {PLAN_FILE}: not a matrix "
                            "folder (matrix folders are results/matrix-<name>-<hash>/; `make "
                            "test-matrix` makes one)")
    try:
        plan = _load_without_aliases(data)
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        raise PlanFileError(f"{path} is damaged ({str(e).splitlines()[0]}): run `make "
                            "test-matrix` with the matrix's .config to write it again") from None
    problem = plan_problem(plan)
    if problem:
        raise PlanFileError(f"{path} is not a plan kgpt wrote ({problem}): run `make "
                            "test-matrix` with the matrix's .config to write it again")
    return plan


# libyaml's parser where PyYAML has it. A plan kgpt writes takes a few hundred bytes and
# a few dozen YAML values a cell, so both limits hold thousands of cells. A planted file
# of millions of bare values once took minutes; past PLAN_EVENTS it is refused after the
# parse alone, before any Python value is built (which is the slow part).
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
PLAN_LIMIT = 4 << 20
PLAN_EVENTS = 1_000_000


def _load_without_aliases(data: bytes) -> Any:
    """YAML as the runner writes plan.yaml (no anchors: PlanDumper), an alias refused
    before anything is built. Ten lines of nested aliases make a plan of a few hundred
    bytes whose every use (a cell id formatted, the plan walked) expands billions of
    values: such a planted plan once took minutes and gigabytes for `make
    matrix-status`."""
    for n, event in enumerate(yaml.parse(data, Loader=LOADER)):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.YAMLError(f"an alias (*{event.anchor}) at line "
                                 f"{event.start_mark.line + 1}: plan.yaml holds none")
        if n > PLAN_EVENTS:  # (building Python values is the slow part: not begun)
            raise yaml.YAMLError(f"more than {PLAN_EVENTS:,} values, past any plan")
    return yaml.load(data, Loader=LOADER)


class PlanDumper(yaml.SafeDumper):
    """How plan.yaml is written: every value in full, never an anchor and an alias
    (which safe_dump makes of a list the plan holds twice), so _load_without_aliases
    reads it."""

    def ignore_aliases(self, data):
        return True


def plan_problem(plan: Any) -> str | None:
    """What makes ``plan`` unlike one gpt2/matrix/runner.py writes; None if nothing."""
    if not isinstance(plan, dict):
        return f"a {type(plan).__name__}, not a mapping"
    if not isinstance(plan.get("name"), str) or not NAME.fullmatch(plan["name"]):
        return "no matrix name"
    if not isinstance(plan.get("hash"), str):
        return "no plan hash"
    axes = plan.get("axes", {})
    if not isinstance(axes, dict):
        return "axes is not a mapping"
    for axis in AXES:
        if not _list_of(axes.get(axis.plural, []), axis.kind):
            return f"axes.{axis.plural} is not a list of {_what(axis)}s"
    grids = axes.get("grids", {})
    if not isinstance(grids, dict) or not all(
            isinstance(g, dict) and all(isinstance(a, dict) and isinstance(a.get("field"), str)
                                        and _list_of(a.get("values"), (int, float))
                                        for a in g.values())
            for g in grids.values()):
        return "axes.grids is not a mapping of grids"
    if not isinstance(plan.get("baseline", ""), str):
        return "baseline is not an optimizer's name"
    target = plan.get("target_loss", 1.0)
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not target > 0:
        return "target_loss is not a positive loss"
    cells = plan.get("cells")
    if not isinstance(cells, list) or not cells:
        return "no cells"
    seen: set[str] = set()
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict):
            return f"cell {i} is not a mapping"
        cid = cell.get("id")
        if not isinstance(cid, str) or not NAME.fullmatch(cid):
            return f"cell {i} has no id kgpt would give ({reprlib.repr(cid)})"
        if cid in seen:
            return f"cell id {cid} is listed twice"
        seen.add(cid)
        if not isinstance(cell.get("config_hash"), str):
            return f"cell {cid} has no configuration hash"
        args = cell.get("args")
        if not isinstance(args, list) or not all(isinstance(a, str) and a.startswith("--")
                                                 for a in args):
            return f"cell {cid}'s args are not train.py flags"
        for axis in AXES:
            value = cell.get(axis.name)
            if value is None:
                # (an axis that applies everywhere is in every cell of a plan with it)
                if axis.optional or axis.needs is not AXES[0].needs:
                    continue
                return f"cell {cid} has no {axis.name.replace('_', ' ')}"
            if not (isinstance(value, axis.kind) and not isinstance(value, bool)
                    and (isinstance(value, str) or _number(value))):
                return f"cell {cid}'s {axis.name.replace('_', ' ')} is not a {_what(axis)}"
        grid = cell.get("grid", {})
        if not isinstance(grid, dict) or not all(isinstance(k, str) and _number(v)
                                                 for k, v in grid.items()):
            return f"cell {cid}'s grid is not a mapping of settings to values"
    ids = {cell["id"] for cell in cells}
    for cell in cells:
        branch = cell.get("branch")
        if branch is not None and not (
                isinstance(branch, dict) and branch.get("from") in ids
                and branch["from"] != cell["id"] and isinstance(branch.get("step"), int)
                and not isinstance(branch["step"], bool) and branch["step"] >= 1):
            return f"cell {cell['id']}'s branch does not name another cell and a step"
    return None


def _what(axis) -> str:
    return "name" if str in axis.kind else "number"


def planned_config(args: list[str]):
    """The Config train.py resolves from a cell's planned arguments (its "args")."""
    parser = StrictArgumentParser(add_help=False)
    add_arguments(parser, TRAIN)
    return config_from_namespace(parser.parse_args(args), TRAIN)


def _number(value: Any) -> bool:
    """A finite int or float, or a bool (a grid may switch a setting on and off)."""
    try:
        return isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an int past float's range
        return False


def _list_of(value: Any, kinds: tuple[type, ...]) -> bool:
    """A list of values of ``kinds``, numbers among them finite."""
    return isinstance(value, list) and all(
        isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)
        and (isinstance(v, str) or _number(v)) for v in value)


# status.json's fields: what the runner and the Slurm task write, each with its range.
STATUS_FIELDS = {
    "attempts": Field(int, 0, 10**6),
    "status": Field(str, choices=STATES),
    "error": Field(str),
    "slurm_job": Field(str),
    "returncode": Field(int, -255, 255),  # (negative: the signal that ended the cell)
    "wall_s": Field(float, 0, 10**9),
}


def status_problem(status: dict[str, dict[str, Any]]) -> str | None:
    """What the writers of status.json check before writing it: None, or why it is not
    a record of cells (a bug)."""
    for cell, entry in status.items():
        why = records.problem(entry, STATUS_FIELDS)
        if why:
            return f"cell {cell}: {why}"
    return None


def read_status(folder: Path) -> dict[str, dict[str, Any]]:
    """status.json: each cell's entry (attempts, status, error, Slurm job, ...).
    Entries that are not objects, fields outside their type or range (an attempts of
    -5 from an edited file), and a file that is not an object are dropped: it is a
    record of what happened, rebuilt as cells run, and never a reason to stop."""
    status = storage.read_json_object(Path(folder) / STATUS_FILE) or {}
    return {cell: records.kept(entry, STATUS_FIELDS) for cell, entry in status.items()
            if isinstance(entry, dict)}
