from __future__ import annotations

from typing import Any

from rest_framework import permissions

from controlplane.accounts.api.permissions import IsOperator
from controlplane.accounts.selectors import is_operator

__all__ = ["IsOperator", "IsOperatorOrReadOnly"]


class IsOperatorOrReadOnly(permissions.BasePermission):
    """Any signed-in user reads (tenants need the catalog and availability); operators write."""

    message = "Only operators may change the inventory."
    refuses_only_writes = True  # the schema documents a 403 on its writes only (controlplane/core/api/schema.py)

    def has_permission(self, request: Any, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or is_operator(request.user)
