from django.db import models


class KeyType(models.TextChoices):
    """The SSH public key types a user may register, by their OpenSSH names."""

    ED25519 = "ssh-ed25519", "Ed25519"
    ECDSA_P256 = "ecdsa-sha2-nistp256", "ECDSA P-256"
    ECDSA_P384 = "ecdsa-sha2-nistp384", "ECDSA P-384"
    ECDSA_P521 = "ecdsa-sha2-nistp521", "ECDSA P-521"
    RSA = "ssh-rsa", "RSA"
