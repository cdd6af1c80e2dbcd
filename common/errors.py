"""Errors a user can act on: every message says what went wrong, where, and how to fix it."""

from __future__ import annotations


class KdError(Exception):
    """An error caused by user input or store state; the CLI prints it and exits with `exit_code` (2)."""

    exit_code = 2

    def __init__(self, what: str, where: str | None = None, fix: str | None = None) -> None:
        self.what, self.where, self.fix = what, where, fix
        parts = [what]
        if where:
            parts.append(f"  where: {where}")
        if fix:
            parts.append(f"  fix:   {fix}")
        super().__init__("\n".join(parts))

    def __reduce__(self):  # pickled whole (what, where, fix), e.g. raised in a Ray worker and re-raised by the driver
        return type(self), (self.what, self.where, self.fix)


class StoreError(KdError):
    """The store is missing, corrupt, incompatible or locked."""


class InputError(KdError):
    """An input file or column cannot be used."""
