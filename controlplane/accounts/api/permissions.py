"""Who may call an endpoint at all, checked before its body is read: the one definition of "an operator only"."""

from __future__ import annotations

from typing import Any

from rest_framework import permissions

from controlplane.accounts.selectors import is_operator


class IsOperator(permissions.BasePermission):
    message = "Only operators may do this."

    def has_permission(self, request: Any, view: Any) -> bool:
        return is_operator(request.user)
