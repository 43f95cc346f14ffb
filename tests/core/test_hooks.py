"""A required hook that nobody registered fails loudly, naming itself and the app that should fill it."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.core import hooks


@pytest.fixture(autouse=True)
def private_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hooks declared here are the test's own: the registration check over the real ones never sees them.
    monkeypatch.setattr(hooks, "_declared", [])


def test_an_unregistered_hook_raises_naming_the_hook_and_its_provider() -> None:
    hook: hooks.RequiredHook[[int], int] = hooks.RequiredHook("test.double", provider="controlplane.example")
    with pytest.raises(ImproperlyConfigured, match=r"test\.double.*controlplane\.example"):
        hook(2)
    assert not hook.registered


def test_a_registered_hook_calls_its_implementation_with_the_arguments() -> None:
    hook: hooks.RequiredHook[[int], int] = hooks.RequiredHook("test.double", provider="controlplane.example")
    hook.register(lambda n: n * 2)
    assert hook.registered
    assert hook(21) == 42


def test_declared_hooks_lists_each_declaration() -> None:
    first: hooks.RequiredHook[[], None] = hooks.RequiredHook("test.first", provider="a")
    second: hooks.RequiredHook[[], None] = hooks.RequiredHook("test.second", provider="b")
    assert hooks.declared_hooks() == [first, second]
