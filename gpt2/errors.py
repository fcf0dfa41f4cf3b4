"""kgpt's error types and exit statuses, in one leaf module.

Every error here is an outcome the user can act on: the entry points print its
message on one line (``error: ...``) and exit with EXIT_BAD_INPUT, never with a
traceback. Anything else that escapes is a bug, and its traceback is printed.
Modules anywhere in gpt2/ import their errors from here, so raising one never
pulls in the module that defines the setting or the file it is about (the import
cycles this replaces went through the configuration).
"""

from __future__ import annotations

from gpt2.names import flag, symbol

# Exit statuses of the entry points (docs/reliability.md). 1 is an unexpected error (a
# bug: its traceback is printed); the others are outcomes the run reports itself.
EXIT_BAD_INPUT = 2  # a bad setting, missing or damaged data, a checkpoint that cannot resume
EXIT_NONFINITE = 3  # stopped before applying a NaN/inf loss's update
EXIT_OUT_OF_MEMORY = 4  # the device ran out of memory
EXIT_INTERRUPTED = 130  # stopped on a signal with a checkpoint (summary "interrupted")


class ConfigError(ValueError):
    """A bad setting. The message names the Kconfig symbol and the flag."""

    def __init__(self, name: str, message: str, where: str | None = None):
        self.name = name
        self.where = where
        self.message = message
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{symbol(name)} ({flag(name)}): {message}")


class KconfigError(Exception):
    """One or more problems in a configuration file, one per line of the message."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class DataError(Exception):
    """Missing, corrupt or unusable data; the message says what to run."""


class StorageError(Exception):
    """A file could not be written (disk full, read-only, not permitted); the message
    names it and says what to do."""


class ExportError(Exception):
    """An export that would overwrite what it did not write; the message says where
    to export instead."""


class ResumeError(Exception):
    """A checkpoint that cannot continue this run."""


class CheckpointError(ResumeError):
    """A checkpoint file that is missing, damaged or unsafe to load."""


class ProvenanceError(ResumeError):
    """The run folder holds a result of other code or data, and the user has not
    said what to do with it (``--if-changed``)."""


class RunBusyError(RuntimeError):
    """Another process holds the run folder."""


class PretrainedError(ValueError):
    """Weights that cannot be found or do not fit the configured model."""


class PlanError(Exception):
    """The matrix cannot be planned; one problem per line."""


class MatrixError(Exception):
    """The matrix cannot start; the message says what to do."""


class SlurmError(Exception):
    """Slurm is not there, or refused or failed a request; the message quotes it and
    says what to do."""


class CollectError(Exception):
    """The folder is not a matrix folder."""


class ResultsError(Exception):
    """A folder named for reading results is not a run or matrix folder, or a run
    cannot be exported or continued as asked; the message says what to do."""


class UsageError(Exception):
    """A make target cannot go on as asked (a make variable it cannot use, a file it
    needs that is missing); the message says what to do."""


class PlanFileError(MatrixError, CollectError, ResultsError):
    """A matrix folder's plan.yaml that is missing, damaged or not one kgpt wrote
    (gpt2/matrix/plan_file.py). It is each of the errors of the commands that read a
    plan (running, collecting, showing results), so each says it in one line."""
