from __future__ import annotations

from rest_framework import serializers

from controlplane.access.models import SshKey


class SshKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = SshKey
        fields = ["id", "name", "key_type", "bits", "fingerprint", "public_key", "comment", "created_at"]
        read_only_fields = fields
        extra_kwargs = {
            "public_key": {"help_text": "The key as stored: its type and base64 blob, without the comment."},
            "fingerprint": {"help_text": "OpenSSH's SHA256 fingerprint, as `ssh-keygen -l` prints it."},
        }


class SshKeyCreateSerializer(serializers.Serializer):
    # Lengths, NULs and the key itself are judged by the service (controlplane/access/sshkeys.py), the one
    # definition the admin uses too; the request body is bounded by API_MAX_REQUEST_BYTES before this.
    name = serializers.CharField(help_text="Your name for the key, unique among yours (at most 100 characters).")
    public_key = serializers.CharField(
        help_text="One OpenSSH public key line, as in a .pub file: `ssh-ed25519 AAAA... you@laptop`."
    )
