"""What the HTTP server admits: one frozen dataclass, validated when built, never changed while serving."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
# OpenAI's own upload limit for /v1/audio/*.
DEFAULT_MAX_UPLOAD_MB = 25


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str  # the id /v1/models lists and requests name in ``model``
    model_aliases: tuple[str, ...] = ("whisper-1",)  # also accepted in ``model`` (OpenAI clients' default)
    api_key: str | None = None  # when set, /v1/* needs ``Authorization: Bearer <api_key>``
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_MB * MIB  # request body size; larger bodies get 413
    max_audio_seconds: float = 3600.0  # decoded audio longer than this gets 400
    max_in_flight: int = 256  # transcription requests admitted at once (decoding or queued); more get 429
    request_timeout_s: float = 600.0  # a request still running after this is aborted with 504
    retry_after_s: int = 1  # the Retry-After a 429 carries

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise ValueError("ServerSettings.served_model_name must not be empty")
        for name in ("max_upload_bytes", "max_in_flight", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerSettings.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_audio_seconds", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServerSettings.{name} must be > 0, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("ServerSettings.api_key must not be blank (leave it unset for an open server)")

    def accepts_model(self, name: str) -> bool:
        return name == self.served_model_name or name in self.model_aliases
