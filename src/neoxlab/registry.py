"""A table of records by name, for the plug points a config names (task.name, engine.name,
cluster.scheduler): a second record under a taken name, or a lookup of a name nobody
registered, is an error that names the value and the known names.

Records register where they are written, so adding one is one entry; the code that uses
them asks the record what it needs and never compares the name itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from neoxlab.config import ConfigError

R = TypeVar("R")


class Registry(Mapping[str, R], Generic[R]):
    """Records by name; read-only once built, except through `register`."""

    def __init__(self, key: str, where: str, records: Mapping[str, R] | None = None):
        self.key = key  # the config key that names a record, e.g. "task.name"
        self.where = where  # where a new record goes, for the fix in an error
        self._records: dict[str, R] = {}
        for name, record in (records or {}).items():
            self.register(name, record)

    def register(self, name: str, record: R) -> R:
        """Add a record; a name already taken is refused (the first would be lost silently)."""
        if name in self._records:
            raise ValueError(f"{self.key}='{name}' is registered twice (known: "
                             f"{list(self._records)}); give the new record a name of its own")
        self._records[name] = record
        return record

    def problem(self, name: str) -> str | None:
        """The rule for a config: its name is known; None when it is."""
        if name in self._records:
            return None
        return (f"{self.key}='{name}' is not one of {list(self._records)}; pick one of them "
                f"(a new one is one entry in {self.where})")

    def __getitem__(self, name: str) -> R:
        problem = self.problem(name)
        if problem is not None:
            raise ConfigError(problem)
        return self._records[name]

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def get(self, name: str, default: R | None = None) -> R | None:
        return self._records.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)
