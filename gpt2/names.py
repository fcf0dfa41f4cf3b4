"""The one naming rule that ties a setting's three spellings together.

    field ``learning_rate``  <->  Kconfig symbol CONFIG_LEARNING_RATE  <->  flag --learning-rate

A leaf module: the error types (gpt2/errors.py) name settings with it, and nothing
here imports the rest of kgpt.
"""

from __future__ import annotations


def symbol(name: str) -> str:
    """Kconfig symbol (with the .config prefix) of a field."""
    return "CONFIG_" + name.upper()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def switch_flag(name: str, on: bool) -> str:
    """The flag that turns an on/off field on (--name) or off (--no-name)."""
    return flag(name) if on else "--no-" + flag(name)[2:]


def choice_symbol(name: str, value: str) -> str:
    """Kconfig symbol of one entry of a choice, e.g. MODEL_SIZE_GPT2_MEDIUM,
    PRUNING_STRUCTURE_2_4."""
    return f"{name.upper()}_{value.upper().replace('-', '_').replace(':', '_')}"


# Settings kgpt no longer has, with what took their place: an old .config line or flag
# that names one is refused (`make olddefconfig` drops the line) with this advice,
# not only as an unknown name.
REMOVED = {
    "eval_batches": ("eval_tokens", "the validation set is sized in tokens now, the same "
                     "windows whatever the batch size (0: the whole validation split)"),
}


def removed_note(name: str, spelling=symbol) -> str | None:
    """'removed: use X (why)' for a removed field ``name``, spelt by ``spelling``
    (symbol or flag), or None."""
    if name not in REMOVED:
        return None
    instead, why = REMOVED[name]
    return f"removed: use {spelling(instead)} instead; {why}"
