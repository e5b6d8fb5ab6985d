"""Registry: implementations of one seam by name, filled by a decorator as their modules import.

One class for every seam (scheduling policies, attention backends, linear methods, MoE
kernels), so registering, refusing a duplicate and naming the valid choices read the same
everywhere. It is a dict, so `name in registry`, iteration and `registry[name]` work as usual.
"""

from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T", bound=type)


class Registry(dict):
    def __init__(self, kind: str) -> None:
        """kind names the setting in error messages, e.g. "scheduling_policy"."""
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[T], T]:
        def add(cls: T) -> T:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is registered twice ({self[name].__name__}, {cls.__name__})")
            cls.name = name
            self[name] = cls
            return cls

        return add

    def lookup(self, name: str) -> type:
        """The class registered as name, or a ValueError naming the valid ones."""
        if name not in self:
            raise ValueError(f"{self.kind}={name!r} is not known; valid: {', '.join(self)}")
        return self[name]
