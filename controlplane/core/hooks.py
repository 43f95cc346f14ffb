"""Required hooks: a step a lower app cannot skip, done by an app above it (docs/design-notes.md, Layers).

A lower app declares the hook; the higher app that owns the step registers its function in its
``AppConfig.ready()``. Calling a hook nobody registered raises ``ImproperlyConfigured`` naming the hook and the
app that should have filled it: a booking that dispatch never hears of, or a retired server whose agent keeps
its credential, is a broken installation, never a quiet default. (Optional hooks, with a documented answer
when unfilled, stay plain functions in each app's ``hooks.py``.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, ParamSpec, TypeVar

from django.core.exceptions import ImproperlyConfigured

P = ParamSpec("P")
R = TypeVar("R")

_declared: list[RequiredHook[..., object]] = []


class RequiredHook(Generic[P, R]):
    """One function that ``provider`` supplies to the app that declares the hook."""

    def __init__(self, name: str, *, provider: str) -> None:
        self.name = name
        self.provider = provider
        self._impl: Callable[P, R] | None = None
        _declared.append(self)  # type: ignore[arg-type]

    def register(self, impl: Callable[P, R]) -> None:
        self._impl = impl

    @property
    def registered(self) -> bool:
        return self._impl is not None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._impl is None:
            raise ImproperlyConfigured(
                f"The hook {self.name} has no implementation: {self.provider} registers it in its "
                "AppConfig.ready(); is it in INSTALLED_APPS?"
            )
        return self._impl(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<RequiredHook {self.name} from {self.provider}{'' if self.registered else ' (unregistered)'}>"


def declared_hooks() -> list[RequiredHook[..., object]]:
    """Every required hook declared so far (each app's hooks module declares its own when imported)."""
    return list(_declared)
