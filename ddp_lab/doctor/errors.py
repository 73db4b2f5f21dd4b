"""The wing's two exceptions that are not findings: the input cannot be checked (the CLIs' exit
status 2), and the wing's own code failed (exit status 3)."""
from __future__ import annotations


class DoctorInputError(ValueError):
    """The doctor cannot start: bad file, name, factory, input, or a module with no parameters.
    The CLI prints the message and exits with status 2."""


class DoctorBug(RuntimeError):
    """The doctor's own code failed on a rank: not a finding about the user's module. The CLI
    prints the message and exits with status 3."""
