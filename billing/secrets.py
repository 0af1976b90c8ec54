"""Organizations' secrets: written by these services, decrypted only for a running step.

A value is stored as a Fernet token (AES-128-CBC with an HMAC-SHA256) under the keys of
``SECRETS_ENCRYPTION_KEYS`` through a MultiFernet: the first key encrypts, every key
decrypts, so a key is rotated by putting a new one first and calling
``secrets_rotate()``. Values are encoded as UTF-8 with ``surrogatepass``, so that any
Python string round-trips (empty, NUL, unpaired surrogates).

The API and the admin write here and list names only; the one reader of values is the
worker (``orchestrator.context.StepContext`` through ``secret_values``). Nothing in this
module logs or puts a value in an exception message.
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from billing.models import SECRET_NAME_RE, Organization, Secret

__all__ = [
    "SecretUnreadable",
    "decrypt_value",
    "encrypt_value",
    "is_valid_secret_name",
    "oncall_set",
    "secret_delete",
    "secret_list",
    "secret_put",
    "secret_values",
    "secrets_rotate",
    "webhook_secret",
]

ROTATE_BATCH = 500


class SecretUnreadable(Exception):
    """A stored secret that none of the configured keys decrypts (a key was removed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"secret {name!r} cannot be decrypted with any key of SECRETS_ENCRYPTION_KEYS"
        )


def is_valid_secret_name(name: object) -> bool:
    return isinstance(name, str) and SECRET_NAME_RE.fullmatch(name) is not None


def _fernet() -> MultiFernet:
    # Built per call (cheap): settings may change under tests and key rotations.
    return MultiFernet([Fernet(key) for key in settings.SECRETS_ENCRYPTION_KEYS])


def encrypt_value(value: str) -> bytes:
    return _fernet().encrypt(value.encode("utf-8", "surrogatepass"))


def decrypt_value(token: bytes | memoryview) -> str:
    """Raises cryptography's InvalidToken when no configured key fits."""
    return _fernet().decrypt(bytes(token)).decode("utf-8", "surrogatepass")


def _check(name: str, value: object) -> None:
    if not is_valid_secret_name(name):
        raise ValueError(
            "a secret name is a letter or _, then letters, digits or _, at most 100 characters"
        )
    if not isinstance(value, str):
        raise TypeError("a secret's value must be a string")


@transaction.atomic
def secret_put(*, organization: Organization, name: str, value: str) -> tuple[Secret, bool]:
    """Create or replace ``name``'s value; return the secret and whether it was created.

    update_or_create locks an existing row; two concurrent creations of one name meet at
    the unique constraint, and the loser updates the winner's row instead of failing.
    """
    _check(name, value)
    return Secret.objects.update_or_create(
        organization=organization, name=name, defaults={"value_encrypted": encrypt_value(value)}
    )


@transaction.atomic
def secret_delete(*, organization: Organization, name: str) -> bool:
    """Delete ``name``; False when the organization has no such secret."""
    deleted, _ = Secret.objects.filter(organization=organization, name=name).delete()
    return deleted > 0


def secret_list(*, organization: Organization) -> QuerySet[Secret]:
    """The organization's secrets by name, without their encrypted values."""
    return (
        Secret.objects.filter(organization=organization)
        .defer("value_encrypted")
        .order_by("name", "id")
    )


def secret_values(*, organization_id: UUID | str, names: Iterable[str]) -> dict[str, str]:
    """The decrypted values of those of ``names`` that the organization has (others are
    missing from the result). Raises SecretUnreadable naming a secret no key decrypts."""
    rows = Secret.objects.filter(organization_id=organization_id, name__in=set(names))
    values: dict[str, str] = {}
    for name, token in rows.values_list("name", "value_encrypted"):
        try:
            values[name] = decrypt_value(token)
        except InvalidToken:
            raise SecretUnreadable(name) from None  # the token says nothing worth chaining
    return values


@transaction.atomic
def oncall_set(
    *,
    organization: Organization,
    webhook_url: str | None = None,
    webhook_secret: str | None = None,
    emails: list[str] | None = None,
) -> Organization:
    """Set who is told of the organization's escalations; ``None`` leaves a field as it
    is, an empty value clears it. The secret is stored encrypted, like a secret's."""
    org = Organization.objects.select_for_update().get(pk=organization.pk)
    fields = []
    if webhook_url is not None:
        org.escalation_webhook_url = webhook_url.strip()
        fields.append("escalation_webhook_url")
    if webhook_secret is not None:
        if not isinstance(webhook_secret, str):
            raise TypeError("a webhook secret must be a string")
        org.escalation_webhook_secret = encrypt_value(webhook_secret) if webhook_secret else None
        fields.append("escalation_webhook_secret")
    if emails is not None:
        org.oncall_emails = sorted({address.strip() for address in emails if address.strip()})
        fields.append("oncall_emails")
    if org.escalation_webhook_url and not org.escalation_webhook_secret:
        # Receivers must be able to tell our posts from anyone's.
        raise ValueError("an escalation webhook needs a signing secret")
    if fields:
        org.save(update_fields=fields)
    return org


def webhook_secret(*, organization_id: UUID | str) -> str:
    """The organization's webhook signing secret ("" when none is set). Raises
    SecretUnreadable when no configured key decrypts it."""
    token = (
        Organization.objects.filter(pk=organization_id)
        .values_list("escalation_webhook_secret", flat=True)
        .first()
    )
    if not token:
        return ""
    try:
        return decrypt_value(token)
    except InvalidToken:
        raise SecretUnreadable("escalation webhook secret") from None


def secrets_rotate() -> int:
    """Re-encrypt every secret under the first key of SECRETS_ENCRYPTION_KEYS, in batches;
    return how many rows were rewritten. Run it after putting a new key first, then drop
    the old keys. Idempotent; a row no key decrypts raises SecretUnreadable."""
    fernet = _fernet()
    rotated = 0
    last_id = 0
    while True:
        with transaction.atomic():
            batch = list(
                Secret.objects.select_for_update()
                .filter(pk__gt=last_id)
                .order_by("pk")
                .values_list("pk", "name", "value_encrypted")[:ROTATE_BATCH]
            )
            for pk, name, token in batch:
                try:
                    fresh = fernet.rotate(bytes(token))
                except InvalidToken:
                    raise SecretUnreadable(name) from None
                # update(), not save(): re-encrypting does not change the value's date.
                Secret.objects.filter(pk=pk).update(value_encrypted=fresh)
        if not batch:
            return rotated + _rotate_webhook_secrets(fernet)
        rotated += len(batch)
        last_id = batch[-1][0]


def _rotate_webhook_secrets(fernet: MultiFernet) -> int:
    """The organizations' webhook secrets, re-encrypted like the secrets."""
    rotated = 0
    with transaction.atomic():
        rows = (
            Organization.objects.select_for_update()
            .filter(escalation_webhook_secret__isnull=False)
            .values_list("pk", "escalation_webhook_secret")
        )
        for pk, token in rows:
            try:
                fresh = fernet.rotate(bytes(token or b""))
            except InvalidToken:
                raise SecretUnreadable("escalation webhook secret") from None
            Organization.objects.filter(pk=pk).update(escalation_webhook_secret=fresh)
            rotated += 1
    return rotated
