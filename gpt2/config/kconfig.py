"""Strict .config loading: the one module every make target reads configuration with.

kconfiglib on its own is forgiving: it ignores an undefined symbol, keeps quiet when
an out-of-range int or a symbol with unmet dependencies falls back to its default,
and reads ``"1e-3" # note`` as if the comment were not there. Each of those is a
setting the user believes is in force and is not. Here every one of them is an
error that names the file, the line, the symbol and the reason.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import kconfiglib

from gpt2 import REPO
from gpt2.config import axes, matrix, slurm
from gpt2.config.options import (CONTROL_CHAR_RE, Config, check_run_name, applies, check_value,
                                 field_type, fields, opt, parse_float, resolve)
from gpt2.errors import ConfigError
from gpt2.names import choice_symbol, removed_note

from gpt2.config.choices import OPTIMIZERS
from gpt2.errors import KconfigError

KCONFIG_FILE = REPO / "Kconfig"
PREFIX = "CONFIG_"

_ASSIGN_RE = re.compile(r"^CONFIG_([A-Za-z0-9_]+)=(.*)$")
_NOT_SET_RE = re.compile(r"^# CONFIG_([A-Za-z0-9_]+) is not set$")
_STRING_RE = re.compile(r'^"((?:[^"\\]|\\.)*)"')
# Inside a quoted value only \" and \\ are escapes; kconfiglib drops the backslash of
# any other pair ("\n" would silently become "n").
_ESCAPE_RE = re.compile(r"\\(.)")
_INT_RE = re.compile(r"^-?[0-9]+$")


@dataclass
class Assignment:
    line: int
    name: str  # symbol name without CONFIG_
    raw: str  # the text after '=' (or 'n' for '# CONFIG_X is not set')
    value: str  # the value kconfiglib should end up with


@dataclass
class LoadedConfig:
    kconf: kconfiglib.Kconfig
    path: Path
    assignments: dict[str, Assignment] = field(default_factory=dict)
    # What a repair load (load(..., repair=True)) drops or changes, one line each.
    repairs: list[str] = field(default_factory=list)
    # The file's text as it was read: what a matrix folder keeps (its ``config``),
    # without opening the file again.
    text: str = ""

    def where(self, name: str) -> str:
        """'file:line' of a symbol's assignment, or where its default comes from."""
        a = self.assignments.get(name)
        return f"{self.path}:{a.line}" if a else f"{self.path} (Kconfig default)"


def new_kconfig() -> kconfiglib.Kconfig:
    """Parse the Kconfig tree; any warning in it is a bug in our Kconfig files."""
    os.environ.setdefault("srctree", str(REPO))
    kconf = kconfiglib.Kconfig(str(KCONFIG_FILE), warn_to_stderr=False,
                               suppress_traceback=False)
    kconf.warn_assign_undef = True
    kconf.warn_assign_override = True
    kconf.warn_assign_redun = False
    if kconf.warnings:
        raise KconfigError([f"Kconfig: {w}" for w in kconf.warnings])
    return kconf


def did_you_mean(name: str, known) -> str:
    """' (did you mean X?)' for the closest known name, or ''."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _parse_lines(kconf: kconfiglib.Kconfig, path: Path, text: str
                 ) -> tuple[dict, list[str], list[str]]:
    """The assignments, the problems, and the lines naming no Kconfig symbol (an error
    when reading strictly; left behind by a repair tool)."""
    assignments: dict[str, Assignment] = {}
    problems: list[str] = []
    unknown: list[str] = []
    # Lines end at '\n' only, as kconfiglib reads them: str.splitlines() would also
    # end them at characters such as U+2028 or \x1c, and the two readers must agree.
    for lineno, line in enumerate(text.split("\n"), 1):
        where = f"{path}:{lineno}"
        # A control character (tab aside) cannot be written back to one line, nor
        # passed on as an argument (NUL).
        control = CONTROL_CHAR_RE.search(line)
        if control:
            named = re.match(r"#? ?(CONFIG_[A-Za-z0-9_]+)", line)
            problems.append(f"{where}: {named.group(1) + ': ' if named else ''}control "
                            f"character {control.group()!r} at column {control.start() + 1}: "
                            "a .config line is one line of printable text; remove it")
            continue
        stripped = line.strip()
        m_not_set = _NOT_SET_RE.match(stripped)
        if not stripped or (stripped.startswith("#") and not m_not_set):
            continue
        m = _ASSIGN_RE.match(line)  # (lines were split at "\n")
        if m_not_set:
            name, raw = m_not_set.group(1), "n"
        elif m:
            name, raw = m.group(1), m.group(2)
        else:
            problems.append(f"{where}: malformed line {line!r}: expected CONFIG_NAME=value, "
                            "'# CONFIG_NAME is not set' or a comment line starting with #")
            continue
        sym = kconf.syms.get(name)
        if (sym is None or not sym.nodes) and removed_note(name.lower()):
            unknown.append(f"{where}: {PREFIX}{name}: {removed_note(name.lower())}")
            continue
        if sym is None or not sym.nodes:
            known = (PREFIX + s.name for s in kconf.unique_defined_syms)
            unknown.append(f"{where}: {PREFIX}{name}: undefined symbol (not in Kconfig: "
                           f"misspelt, or removed){did_you_mean(PREFIX + name, known)}")
            continue
        if name in assignments:
            problems.append(f"{where}: {PREFIX}{name}: set more than once (first at line "
                            f"{assignments[name].line})")
            continue
        value, problem = _check_syntax(sym, raw, bool(m_not_set))
        if problem:
            problems.append(f"{where}: {PREFIX}{name}: {problem}")
            continue
        assignments[name] = Assignment(lineno, name, raw, value)
    return assignments, problems, unknown


def _check_syntax(sym: kconfiglib.Symbol, raw: str, not_set: bool) -> tuple[str, str | None]:
    """Return (expected value, problem) for one assignment's text."""
    typ = sym.orig_type
    comment_hint = " (inline '# comments' are not allowed; put the comment on its own line)"
    if typ == kconfiglib.BOOL:
        if raw in ("y", "n"):
            return raw, None
        return "", f"{raw!r} is not a bool value: use y or n" + (comment_hint if "#" in raw else "")
    if not_set:
        return "", "'is not set' only applies to bool symbols"
    if typ == kconfiglib.INT:
        if _INT_RE.match(raw):
            return str(int(raw)), None
        return "", f"{raw!r} is not an integer" + (comment_hint if "#" in raw else "")
    if typ == kconfiglib.STRING:
        m = _STRING_RE.match(raw)
        if not m and raw.startswith('"'):
            return "", f"{raw!r} has no closing quote: a string ends on its own line"
        if not m:
            return "", (f"{raw!r} is not a quoted string: string symbols (floats included) "
                        f'need quotes, e.g. {PREFIX}{sym.name}="{raw}"')
        rest = raw[m.end():]
        if rest:
            return "", f"unexpected text {rest!r} after the closing quote" + comment_hint
        bad = next((e for e in _ESCAPE_RE.finditer(m.group(1)) if e.group(1) not in '"\\'),
                   None)
        if bad:
            return "", (f"{bad.group()} is not an escape: inside quotes only \\\" and \\\\ "
                        "are (write \\\\ for a backslash)")
        return kconfiglib.unescape(m.group(1)), None
    return "", f"unsupported symbol type {kconfiglib.TYPE_TO_STR[typ]}"


def _why_not_taken(sym: kconfiglib.Symbol, a: Assignment, loaded: LoadedConfig
                   ) -> tuple[str, str]:
    """Why an assignment did not take, and what to do about it."""
    # An unmet dependency comes first: for a choice entry it is why another entry won.
    if kconfiglib.expr_value(sym.direct_dep) == 0:
        return (f"unmet dependency ({kconfiglib.expr_str(sym.direct_dep)})",
                "enable that first, or remove this line (`make olddefconfig` removes such "
                "leftovers and lists them)")
    if sym.choice is not None:
        sel = sym.choice.selection
        if a.value == "y" and sel is not None and sel is not sym:
            other = loaded.assignments.get(sel.name)
            at = f" (line {other.line})" if other else " (its default)"
            return (f"only one entry of this choice can be y, and {PREFIX}{sel.name}{at} is "
                    "selected", "set one of them to y and remove the other")
        if a.value == "n" and sel is sym:
            return "a choice always has one entry selected", "set another one to y"
    if sym.orig_type == kconfiglib.INT and sym.ranges:
        lo, hi = (int(x.str_value) for x in sym.ranges[0][:2])
        if not lo <= int(a.value) <= hi:
            field_name = sym.name.lower()
            why = opt(field_name).why if field_name in Config.__dataclass_fields__ else ""
            return (f"{a.value} is outside the allowed range [{lo}, {hi}]"
                    + (f" ({why})" if why else ""), "choose a value in it")
    return f"Kconfig resolved it to {sym.str_value!r} instead of {a.value!r}", "check the line"


def _took(sym: kconfiglib.Symbol, a: Assignment) -> bool:
    if sym.orig_type == kconfiglib.INT and _INT_RE.match(sym.str_value):
        return int(sym.str_value) == int(a.value)  # CONFIG_SEED=007 is 7
    return sym.str_value == a.value


def load(path: str | os.PathLike, *, complete: bool = False,
         kconf: kconfiglib.Kconfig | None = None, repair: bool = False) -> LoadedConfig:
    """Load a .config or defconfig strictly.

    ``complete`` demands a value for every user-settable symbol (a full .config);
    a defconfig lists only what differs from the defaults. ``repair`` is for the
    configuration tools, whose job is to write a clean file: a line that names no
    symbol, or that Kconfig does not take (an unmet dependency, a second choice
    entry), is listed in ``LoadedConfig.repairs`` with what becomes of it instead of
    refused. Lines that cannot be read at all stay errors in every mode.
    """
    path = Path(path)
    if not path.is_file():
        raise KconfigError([f"{path}: no such configuration file"])
    kconf = kconf or new_kconfig()
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise KconfigError([f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x}): "
                            "save the file as UTF-8"]) from None
    assignments, problems, unknown = _parse_lines(kconf, path, text)
    if problems:
        raise KconfigError(problems)
    if not repair:
        problems += [f"{u}; fix the name or remove the line" for u in unknown]
    kconf.warnings.clear()
    kconf.load_config(str(path), replace=True)
    loaded = LoadedConfig(kconf, path, assignments, text=text)
    # kconfiglib's own warnings repeat the undefined symbols found above.
    warnings = [f"{path}: {w}" for w in kconf.warnings if not (unknown and "undefined" in w)]
    loaded.repairs += [f"{u}: dropped" for u in unknown]
    for a in assignments.values():
        sym = kconf.syms[a.name]
        if _took(sym, a):
            continue
        reason, advice = _why_not_taken(sym, a, loaded)
        if repair:
            now = sym.config_string.strip() or "dropped"
            loaded.repairs.append(f"{path}:{a.line}: {PREFIX}{a.name}={a.raw}: {reason}: "
                                  + (now if now == "dropped" else f"now {now}"))
        else:
            problems.append(f"{path}:{a.line}: {PREFIX}{a.name}={a.raw}: did not take: "
                            f"{reason}; {advice}")
    if repair:
        lines = re.compile(re.escape(str(path)) + r":(\d+):")
        loaded.repairs.sort(key=lambda r: int(lines.match(r).group(1)) if lines.match(r) else 0)
        loaded.repairs += warnings
    else:
        problems += warnings
    problems += _slurm_problems(loaded)
    if complete:
        new = new_symbols(kconf)
        if new:
            problems.append(f"{path}: {len(new)} setting(s) are missing, most likely added to "
                            f"Kconfig since this file was written: {', '.join(new)}. Run "
                            "`make olddefconfig` to take their defaults (`make listnewconfig` "
                            "lists them, `make oldconfig` asks for each)")
    if problems:
        raise KconfigError(problems)
    return loaded


def _slurm_problems(loaded: LoadedConfig) -> list[str]:
    """The Slurm menu's strings are in force in every configuration (a single run
    can be submitted too), so they are checked on every load."""
    problems = []
    for name, parse in slurm.PARSERS.items():
        sym = loaded.kconf.syms.get(name)
        if sym is None or not sym.config_string:
            continue
        try:
            parse(sym.str_value)
        except ValueError as e:
            problems.append(f"{loaded.where(name)}: {PREFIX}{name}: {e}")
    return problems


def value_problem(name: str, text: str) -> str | None:
    """Why ``text`` is not a valid value of symbol ``name`` beyond its Kconfig type
    (a float held in a string, a run name, a matrix list), or None. The configuration
    tools call it as a value is entered, so no tool saves what `make` would refuse."""
    parsers: dict[str, Any] = {matrix.SWEEP: matrix.parse_sweep,
                               matrix.BASELINE: matrix.parse_baseline,
                               matrix.TARGET_LOSS: matrix.parse_target_loss, **slurm.PARSERS}
    parsers |= {a.symbol: a.parse for a in axes.AXES if a.parse is not None}
    for optimizer in OPTIMIZERS:
        for label in matrix.tuning_grids(optimizer):
            parsers[matrix.grid_symbol(label, optimizer)] = (
                lambda t, positive=matrix.is_rate(label): matrix.parse_grid(t, positive))
    field_name = name.lower()
    try:
        if name in parsers:
            parsers[name](text)
        elif field_name in {f.name for f in fields()} and not opt(field_name).choices:
            if field_type(field_name) is float:
                check_value(field_name, parse_float(field_name, text))
            elif field_name == "run_name":
                check_run_name(text)
            elif field_type(field_name) is str and CONTROL_CHAR_RE.search(text):
                return "holds a control character"
    except ConfigError as e:
        return e.message
    except ValueError as e:
        return str(e)
    return None


def apply_settings(loaded: LoadedConfig, items: list[str]) -> list[str]:
    """Apply ``NAME=value`` edits (``make setconfig``) in order, each checked as the
    loader would check it in a file; a choice takes its registry value
    (``OPTIMIZER=muon``). Returns the edits as applied; raises KconfigError."""
    kconf = loaded.kconf
    done: list[str] = []
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip().upper().removeprefix(PREFIX)
        if not eq or not name:
            raise KconfigError([f"{item!r}: write NAME=value, e.g. LEARNING_RATE=1e-3"])
        if name in kconf.named_choices:
            field_name = name.lower()
            if field_name in {f.name for f in fields()}:
                choices = opt(field_name).choices
            else:  # a choice of the bridge's own (MATRIX_BACKEND): its entries' names
                choices = tuple(s.name[len(name) + 1:].lower()
                                for s in kconf.named_choices[name].syms)
            entry = kconf.syms.get(choice_symbol(field_name, value)) if value in choices else None
            if entry is None:
                raise KconfigError([f"{PREFIX}{name}={value}: not one of "
                                    f"{', '.join(choices)}{did_you_mean(value, choices)}"])
            sym, text = entry, "y"
        else:
            sym = kconf.syms.get(name)
            if (sym is None or not sym.nodes) and removed_note(name.lower()):
                raise KconfigError([f"{PREFIX}{name}: {removed_note(name.lower())}"])
            if sym is None or not sym.nodes:
                known = [s.name for s in kconf.unique_defined_syms] + list(kconf.named_choices)
                raise KconfigError([f"{PREFIX}{name}: undefined symbol (not in Kconfig)"
                                    f"{did_you_mean(name, known)}"])
            text, problem = _check_syntax(sym, f'"{_escape(value)}"' if sym.orig_type ==
                                          kconfiglib.STRING else value, False)
            problem = problem or (sym.orig_type == kconfiglib.STRING
                                  and value_problem(name, text))
            if problem:
                raise KconfigError([f"{PREFIX}{name}={value}: {problem}"])
        a = Assignment(0, sym.name, text, text)
        sym.set_value(text)
        if not _took(sym, a):
            reason, fix = _why_not_taken(sym, a, loaded)
            if reason.startswith("unmet dependency"):
                fix = "set what it depends on first, earlier in the same SET"
            raise KconfigError([f"{PREFIX}{name}={value}: did not take: {reason}; {fix}"])
        done.append(f"{PREFIX}{name}={value}")
    return done


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def new_symbols(kconf: kconfiglib.Kconfig) -> list[str]:
    """Settings with no value in the loaded file (kconfiglib's listnewconfig rule),
    a choice named once rather than entry by entry."""
    out: list[str] = []
    for sym in kconf.unique_defined_syms:
        if sym.user_value is None and (
                len(sym.assignable) > 1
                or (sym.visibility and (sym.orig_type in (kconfiglib.INT, kconfiglib.STRING)
                                        or sym.choice))):
            if sym.choice is not None:
                if sym.choice.user_selection is None and sym.choice.name not in out:
                    out.append(sym.choice.name)
                continue
            out.append(sym.name)
    return out


def is_active(kconf: kconfiglib.Kconfig, name: str) -> bool:
    """Whether a field's symbol is in force (written to .config) under the current
    values; e.g. N_LAYER only counts when MODEL_SIZE is custom."""
    if opt(name).choices:
        return kconf.named_choices[name.upper()].selection is not None
    return kconf.syms[name.upper()].config_string != ""


def symbol_value(kconf: kconfiglib.Kconfig, name: str) -> Any:
    """The value of a field's symbol, as text (floats unparsed) or bool."""
    if opt(name).choices:
        sel = kconf.named_choices[name.upper()].selection
        for value in opt(name).choices:
            if choice_symbol(name, value) == sel.name:
                return value
        raise KconfigError([f"{PREFIX}{sel.name}: no registry entry matches this choice"])
    sym = kconf.syms[name.upper()]
    typ = field_type(name)
    if typ is bool:
        return sym.tri_value == 2
    if typ is int:
        return int(sym.str_value)
    return sym.str_value


def to_values(loaded: LoadedConfig) -> tuple[dict[str, Any], list[str]]:
    """The typed values of the fields in force, unchecked across fields, and their
    names (the ones to pass to the entry points). Errors name file and line."""
    values: dict[str, Any] = {}
    active: list[str] = []
    problems: list[str] = []
    for f in fields():
        if not is_active(loaded.kconf, f.name):
            continue
        active.append(f.name)
        value = symbol_value(loaded.kconf, f.name)
        try:
            if field_type(f.name) is float:
                value = parse_float(f.name, value)
            elif f.name == "run_name":
                check_run_name(value)  # here too: a test matrix names its folder with it
            values[f.name] = value
        except ConfigError as e:
            problems.append(f"{loaded.where(f.name.upper())}: {e}")
    if problems:
        raise KconfigError(problems)
    return values, active


def to_config(loaded: LoadedConfig, adjust: Callable[[dict], dict] | None = None
              ) -> tuple[Config, list[str]]:
    """The typed Config of a single-run file, and the names of the fields in force.
    ``adjust`` may change the values before they are checked (a smoke test's)."""
    if to_matrix(loaded) is not None:
        raise KconfigError([f"{loaded.where(matrix.ENABLE)}: {PREFIX}{matrix.ENABLE}=y: this "
                            "configuration describes a test matrix, not one run; run it "
                            "with `make test-matrix` (or `make`)"])
    values, active = to_values(loaded)
    if adjust is not None:
        values = adjust(values)
    try:
        cfg = resolve(values)
    except ConfigError as e:
        raise KconfigError([f"{loaded.where(e.name.upper())}: {e}"]) from None
    return cfg, active


def to_config_with(loaded: LoadedConfig, used_by: str | None, explicit: dict[str, Any],
                   adjust: Callable[[dict], dict] | None = None,
                   source: str = "its command line") -> tuple[Config, bool]:
    """The Config of a single-run file for one entry point (None: all), with ``explicit`` values
    (its command-line flags, or make's TRAIN_ARGS) over it, built and checked once; and
    whether they change what the file says. A file setting the flags put out of force
    (SPAM's threshold once --optimizer sgd is given) is left out. ``adjust`` changes
    the file's values first (a smoke test's); an error names the file's line, or
    ``source`` for a value the flags gave."""
    if to_matrix(loaded) is not None:
        to_config(loaded)  # (says it is a matrix)
    values, active = to_values(loaded)
    if adjust is not None:
        values = adjust(values)
    ours = {f.name for f in fields(used_by)}
    effective = Config(**{**{n: values[n] for n in active if n in ours}, **explicit})
    given = {n: values[n] for n in active
             if n in ours and n not in explicit and applies(effective, n)}
    try:
        cfg = resolve({**given, **explicit})
    except ConfigError as e:
        where = source if e.name in explicit else loaded.where(e.name.upper())
        raise KconfigError([f"{where}: {e}"]) from None
    changed = any(value != values.get(name, getattr(Config, name))
                  for name, value in explicit.items())
    return cfg, changed


def to_matrix(loaded: LoadedConfig) -> matrix.MatrixSettings | None:
    """The Matrix menu's settings, or None when CONFIG_MATRIX is off."""
    kconf = loaded.kconf
    if kconf.syms[matrix.ENABLE].tri_value != 2:
        return None

    def on(name: str) -> bool:
        return kconf.syms[name].tri_value == 2

    problems = []
    listed: dict[str, tuple] = {}  # each axis's values, by its plural
    for axis in axes.AXES:
        if axis.entries:  # one bool per registry entry
            listed[axis.plural] = tuple(e for e in axis.entries if on(axis.symbol(e)))
            if not listed[axis.plural] and not axis.optional:
                problems.append(f"{loaded.path}: {axis.none_enabled}")
            continue
        sym = kconf.syms[axis.symbol]
        if not sym.config_string:
            listed[axis.plural] = ()  # not in force (no pruning method: no sparsity axis)
            continue
        try:
            listed[axis.plural] = axis.parse(sym.str_value)
        except ValueError as e:
            problems.append(f"{loaded.where(axis.symbol)}: {PREFIX}{axis.symbol}: {e}")
    optimizers = listed.get("optimizers", ())
    parsed: dict[str, Any] = {}
    sym = kconf.syms[matrix.JOBS]
    if sym.config_string:  # (local backend only)
        try:
            parsed[matrix.JOBS] = matrix.parse_jobs(sym.str_value)
        except ValueError as e:
            problems.append(f"{loaded.where(matrix.JOBS)}: {PREFIX}{matrix.JOBS}: {e}")
    grids: dict[str, dict[str, tuple[float, ...]]] = {}
    if on(matrix.TUNE):
        for optimizer in optimizers:
            grids[optimizer] = {}
            for label in matrix.tuning_grids(optimizer):
                name = matrix.grid_symbol(label, optimizer)
                if not kconf.syms[name].config_string:
                    continue  # not in force (Muon's AdamW-part grids under Moonlight)
                try:
                    grids[optimizer][label] = matrix.parse_grid(kconf.syms[name].str_value,
                                                                positive=matrix.is_rate(label))
                except ValueError as e:
                    problems.append(f"{loaded.where(name)}: {PREFIX}{name}: {e}")
    try:
        sweep = matrix.parse_sweep(kconf.syms[matrix.SWEEP].str_value)
    except ValueError as e:
        problems.append(f"{loaded.where(matrix.SWEEP)}: {PREFIX}{matrix.SWEEP}: {e}")
    try:
        baseline = matrix.parse_baseline(kconf.syms[matrix.BASELINE].str_value)
    except ValueError as e:
        problems.append(f"{loaded.where(matrix.BASELINE)}: {PREFIX}{matrix.BASELINE}: {e}")
    else:
        # With one optimizer there is nothing to pair; with several, a baseline
        # outside the matrix would leave the report without its comparison.
        if len(optimizers) > 1 and baseline not in optimizers:
            problems.append(
                f"{loaded.where(matrix.BASELINE)}: {PREFIX}{matrix.BASELINE}: {baseline} is "
                f"not in this matrix (its optimizers: {', '.join(optimizers)}); name one of "
                f"them or enable {PREFIX}{axes.optimizer_symbol(baseline)}")
    target_loss = None
    try:
        target_loss = matrix.parse_target_loss(kconf.syms[matrix.TARGET_LOSS].str_value)
    except ValueError as e:
        problems.append(f"{loaded.where(matrix.TARGET_LOSS)}: {PREFIX}{matrix.TARGET_LOSS}: {e}")
    oneshot: tuple[str, ...] = ()
    if kconf.syms[matrix.ONESHOT].config_string:
        try:
            oneshot = matrix.parse_oneshot(kconf.syms[matrix.ONESHOT].str_value)
        except ValueError as e:
            problems.append(f"{loaded.where(matrix.ONESHOT)}: {PREFIX}{matrix.ONESHOT}: {e}")
        if oneshot and listed.get("pruning_methods", ()) == ("none",):
            problems.append(f"{loaded.where(matrix.ONESHOT)}: {PREFIX}{matrix.ONESHOT}: one-shot "
                            "baselines prune at the sparsities of the matrix's pruned cells, "
                            "and it has none: enable a pruning method beside none")
    finetune = kconf.syms[matrix.ONESHOT_FINETUNE]
    if problems:
        raise KconfigError(problems)
    backend = next(b for b in slurm.BACKENDS if on(matrix.backend_symbol(b)))
    own = {f.name for f in dataclasses.fields(matrix.MatrixSettings)}
    return matrix.MatrixSettings(**{k: v for k, v in listed.items() if k in own},
                                 more={k: v for k, v in listed.items() if k not in own},
                                 jobs=parsed.get(matrix.JOBS, 1),  # (local backend only)
                                 backend=backend,
                                 grids=grids, sweep=sweep, baseline=baseline,
                                 branch=on(matrix.BRANCH),
                                 extend_rounds=(int(kconf.syms[matrix.ROUNDS].str_value)
                                                if on(matrix.EXTEND) else 0),
                                 oneshot=oneshot, target_loss=target_loss,
                                 oneshot_finetune=(int(finetune.str_value)
                                                   if oneshot and finetune.config_string else 0))


def to_slurm(loaded: LoadedConfig) -> slurm.SlurmSettings:
    """The Slurm menu's settings (checked on load: see _slurm_problems)."""
    syms = loaded.kconf.syms

    def text(name: str) -> str:
        return syms[name].str_value

    return slurm.SlurmSettings(
        partition=slurm.parse_name(text(slurm.PARTITION)),
        account=slurm.parse_name(text(slurm.ACCOUNT)), qos=slurm.parse_name(text(slurm.QOS)),
        time_limit=slurm.parse_time_limit(text(slurm.TIME_LIMIT)),
        signal_margin=int(text(slurm.SIGNAL_MARGIN)), gpus=int(text(slurm.GPUS)),
        cpus=int(text(slurm.CPUS)), mem=slurm.parse_mem(text(slurm.MEM)),
        max_running=int(text(slurm.MAX_RUNNING)), nodes=int(text(slurm.NODES)),
        extra_options=slurm.parse_extra_options(text(slurm.EXTRA_OPTIONS)))
