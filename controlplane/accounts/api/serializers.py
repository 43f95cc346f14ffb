from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework import serializers

from controlplane.accounts.choices import Role
from controlplane.accounts.models import ApiToken, Membership, Project
from controlplane.core.api.fields import AwareDateTimeField, SlugRelatedField, StrictBooleanField

User = get_user_model()
# A project's description: free text, shown in the portal.
DESCRIPTION_MAX = 2000
# Longer than any password a person or a manager types; bounds the hashing work a login may ask for.
PASSWORD_MAX = 1024


class ProjectSerializer(serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = ["id", "name", "slug", "description", "requeue_on_interrupt", "created_at"]
        read_only_fields = ["id", "slug", "created_at"]


class ProjectCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120)
    slug = serializers.SlugField(max_length=80, required=False, allow_blank=True, default="")
    description = serializers.CharField(max_length=DESCRIPTION_MAX, required=False, allow_blank=True, default="")
    requeue_on_interrupt = StrictBooleanField(required=False, default=False)
    owner = SlugRelatedField(
        slug_field="username", queryset=User.objects.all(), help_text="Username of the project's first owner."
    )


class ProjectUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120, required=False)
    description = serializers.CharField(max_length=DESCRIPTION_MAX, required=False, allow_blank=True)
    requeue_on_interrupt = StrictBooleanField(required=False)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)
    user_id = serializers.IntegerField(read_only=True)

    class Meta:
        model = Membership
        fields = ["user_id", "username", "role", "created_at"]
        read_only_fields = fields


class MembershipAddSerializer(serializers.Serializer):
    username = SlugRelatedField(slug_field="username", queryset=User.objects.filter(is_active=True))
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class MembershipRoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class ApiTokenSerializer(serializers.ModelSerializer):
    active = serializers.SerializerMethodField()
    prefix = serializers.SerializerMethodField(help_text="The token's public part, to recognise it.")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at", "active"]
        read_only_fields = fields

    def get_active(self, token: ApiToken) -> bool:
        return token.is_active()

    def get_prefix(self, token: ApiToken) -> str:
        return f"gcp_{token.lookup}_"


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_at = AwareDateTimeField(required=False, allow_null=True, default=None)


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The plaintext token. Shown only in this response.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class MeMembershipSerializer(serializers.ModelSerializer):
    project_id = serializers.IntegerField(read_only=True)
    project_slug = serializers.CharField(source="project.slug", read_only=True)
    project_name = serializers.CharField(source="project.name", read_only=True)

    class Meta:
        model = Membership
        fields = ["project_id", "project_slug", "project_name", "role"]
        read_only_fields = fields


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    is_operator = serializers.BooleanField()
    memberships = MeMembershipSerializer(many=True)


class SessionSerializer(serializers.Serializer):
    authenticated = serializers.BooleanField(help_text="Whether this browser session is signed in.")
    user = MeSerializer(allow_null=True, help_text="The signed-in user, as /me/ gives it; null when signed out.")


class LoginSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=User._meta.get_field("username").max_length)
    password = serializers.CharField(max_length=PASSWORD_MAX, style={"input_type": "password"}, trim_whitespace=False)


class CsrfSerializer(serializers.Serializer):
    csrf_token = serializers.CharField(help_text="Send it back in the X-CSRFToken header on unsafe requests.")
