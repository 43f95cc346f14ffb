"""Plain values that describe a booking, validated once here whether they come from the API or from code."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from controlplane.core.errors import ValidationFailed

# A client clock a little behind ours must not make "start now" fail.
START_SKEW = timedelta(minutes=2)


@dataclass(frozen=True)
class GpuSpec:
    gpu_model_id: int | None = None
    min_memory_mib: int | None = None
    gpu_count: int | None = None
    whole_servers: int | None = None

    def validate(self) -> None:
        fields: dict[str, list[str]] = {}
        if (self.gpu_model_id is None) == (self.min_memory_mib is None):
            fields["spec.gpu_model"] = ["Give either a GPU model or a minimum GPU memory, not both or neither."]
        if self.min_memory_mib is not None and self.min_memory_mib < 1:
            fields["spec.min_memory_mib"] = ["Must be at least 1."]
        if (self.gpu_count is None) == (self.whole_servers is None):
            fields["spec.gpu_count"] = ["Give either a GPU count or a number of whole servers, not both or neither."]
        if self.gpu_count is not None and self.gpu_count < 1:
            fields["spec.gpu_count"] = ["Must be at least 1."]
        if self.whole_servers is not None and self.whole_servers < 1:
            fields["spec.whole_servers"] = ["Must be at least 1."]
        if fields:
            raise ValidationFailed(_sentence(fields), fields=fields)


@dataclass(frozen=True)
class Window:
    starts_at: datetime
    ends_at: datetime

    @property
    def seconds(self) -> float:
        return (self.ends_at - self.starts_at).total_seconds()

    def validate(self, *, now: datetime | None = None, future_only: bool = True) -> None:
        now = now or timezone.now()
        fields: dict[str, list[str]] = {}
        if self.ends_at <= self.starts_at:
            fields["window.end"] = ["The window must end after it starts."]
        if future_only and self.starts_at < now - START_SKEW:
            fields["window.start"] = ['The window cannot start in the past; use "now" to start at once.']
        if fields:
            raise ValidationFailed(_sentence(fields), fields=fields)


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        fields: dict[str, list[str]] = {}
        if not self.image or not self.image.strip():
            fields["container.image"] = ["This field is required."]
        if not isinstance(self.command, list) or not all(isinstance(part, str) for part in self.command):
            fields["container.command"] = ["Must be a list of strings."]
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            fields["container.env"] = ["Must be a map of strings to strings."]
        if fields:
            raise ValidationFailed(_sentence(fields), fields=fields)


def _sentence(fields: dict[str, list[str]]) -> str:
    return "; ".join(f"{name}: {' '.join(messages)}" for name, messages in fields.items())
