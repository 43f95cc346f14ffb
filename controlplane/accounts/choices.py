from django.db import models


class Role(models.TextChoices):
    OWNER = "owner", "Owner"  # manages members and tokens, books
    MEMBER = "member", "Member"  # books
    VIEWER = "viewer", "Viewer"  # reads


BOOKING_ROLES = frozenset({Role.OWNER, Role.MEMBER})
