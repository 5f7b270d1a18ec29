"""Endpointing: when a stream's current utterance is over, decided from per-frame silence. Pure Python, no torch.

After each decoded chunk the runtime hands an ``Endpointer`` one flag per encoder frame (did the transducer emit
a non-blank token there), optionally the blank posterior or a VAD speech probability per frame. A frame is
*silent* according to ``EndpointConfig.silence_source``; the endpointer counts the utterance's frames, its run of
trailing silent frames, and whether any frame was speech. An endpoint fires at the first frame where any
``EndpointRule`` holds (the sherpa-onnx rule form). The runtime then finalises the utterance at the end of that
chunk and resets its decoder; the endpointer has already reset itself (see ``Endpointer.update``).

No endpointing is spelled ``None`` (an ``EndpointConfig | None`` option), not a config with no rules: a stream
without endpointing then holds no endpointer at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

SilenceSource = Literal["decoder", "vad"]
_SILENCE_SOURCES = ("decoder", "vad")


@dataclass(frozen=True)
class EndpointRule:
    """Fires when (speech was seen or not ``must_contain_speech``) and both minimums below are reached."""

    must_contain_speech: bool
    min_trailing_silence_s: float  # the utterance's last frames have been silent at least this long ...
    min_utterance_s: float  # ... and the utterance (speech and silence since the last endpoint) is this long
    name: str = ""  # for logs and metrics only

    def __post_init__(self) -> None:
        for field in ("min_trailing_silence_s", "min_utterance_s"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"EndpointRule.{field} must be a finite number >= 0, got {value}")
        if self.min_trailing_silence_s == 0 and self.min_utterance_s == 0:
            raise ValueError("an EndpointRule with no trailing silence and no utterance length fires on every frame")


DEFAULT_RULES = (
    # An utterance that is only silence still ends, so a quiet stream does not grow one utterance forever.
    EndpointRule(False, 2.4, 0.0, "silence"),
    EndpointRule(True, 1.2, 0.0, "pause_after_speech"),
    # Bounds the latency of a final result and the decoder state a talker who never pauses builds up.
    EndpointRule(False, 0.0, 20.0, "max_utterance"),
)


@dataclass(frozen=True)
class EndpointConfig:
    rules: tuple[EndpointRule, ...] = DEFAULT_RULES  # an endpoint fires when any of them holds
    # "decoder": silent = no token emitted (and blank posterior >= blank_threshold where given);
    # "vad": silent = VAD speech probability < vad_threshold, whatever the decoder emitted.
    silence_source: SilenceSource = "decoder"
    # Below 1 so that frames the model was unsure about (no token, but real token mass) count as speech.
    blank_threshold: float = 0.95
    vad_threshold: float = 0.5  # Silero's own speech threshold

    def __post_init__(self) -> None:
        if not self.rules:
            raise ValueError("EndpointConfig needs at least one rule; pass None for no endpointing")
        if not all(isinstance(rule, EndpointRule) for rule in self.rules):
            raise ValueError(f"EndpointConfig.rules must all be EndpointRule, got {self.rules!r}")
        if self.silence_source not in _SILENCE_SOURCES:
            raise ValueError(f"silence_source must be one of {_SILENCE_SOURCES}, got {self.silence_source!r}")
        for field in ("blank_threshold", "vad_threshold"):
            value = getattr(self, field)
            if not 0 <= value <= 1:
                raise ValueError(f"EndpointConfig.{field} must be in [0, 1], got {value}")

    @classmethod
    def from_options(
        cls, *, enabled: bool = True, trailing_silence_ms: int | None = None, max_utterance_s: float | None = None
    ) -> EndpointConfig | None:
        """The config behind simple user options (CLI/HTTP); ``None`` when endpointing is off.

        ``trailing_silence_ms`` is the pause after speech that ends an utterance; ``max_utterance_s`` the longest
        utterance. Either left ``None`` keeps the default rule.
        """
        if not enabled:
            return None
        silence, pause, longest = DEFAULT_RULES
        if trailing_silence_ms is not None:
            if trailing_silence_ms <= 0:
                raise ValueError(f"trailing_silence_ms must be > 0, got {trailing_silence_ms}")
            pause_s = trailing_silence_ms / 1000
            pause = EndpointRule(True, pause_s, 0.0, pause.name)
            # The silence-only rule needs no speech, so a shorter one would cut every pause the user asked for.
            silence = EndpointRule(False, max(silence.min_trailing_silence_s, pause_s), 0.0, silence.name)
        if max_utterance_s is not None:
            if max_utterance_s <= 0:
                raise ValueError(f"max_utterance_s must be > 0, got {max_utterance_s}")
            longest = EndpointRule(False, 0.0, max_utterance_s, longest.name)
        return cls(rules=(silence, pause, longest))


@dataclass(frozen=True)
class Endpoint:
    rule_index: int  # into EndpointConfig.rules
    rule: EndpointRule
    frame: int  # index, within the chunk passed to update(), of the frame at which the rule first held
    utterance_s: float  # the ended utterance's length, that frame included
    trailing_silence_s: float


def _num_frames(seconds: float, frame_s: float) -> int:
    # Frames needed to cover ``seconds``; the tolerance keeps 0.56 s / 0.08 s (7.000000000000001) at 7.
    return math.ceil(seconds / frame_s - 1e-9)


class Endpointer:
    """One stream's endpointing state. Counts frames, so its decisions do not depend on how chunks are cut."""

    def __init__(self, config: EndpointConfig, frame_s: float) -> None:
        if not (math.isfinite(frame_s) and frame_s > 0):
            raise ValueError(f"frame_s must be a finite number > 0, got {frame_s}")
        self.config = config
        self.frame_s = frame_s
        # (silent frames, utterance frames) each rule needs, fixed once so update() compares integers only.
        self._needs = [
            (_num_frames(r.min_trailing_silence_s, frame_s), _num_frames(r.min_utterance_s, frame_s))
            for r in config.rules
        ]
        for rule, (silent, total) in zip(config.rules, self._needs):
            if silent == 0 and total <= 1:  # every utterance has at least one frame when rules are checked
                raise ValueError(f"{rule} is shorter than one {frame_s} s frame and would fire on every frame")
        self.reset()

    def reset(self) -> None:
        """Start a new utterance (the runtime calls this when it resets the decoder for another reason)."""
        self._utterance_frames = 0
        self._trailing_silent_frames = 0
        self._has_speech = False

    @property
    def utterance_frames(self) -> int:
        return self._utterance_frames

    @property
    def trailing_silent_frames(self) -> int:
        return self._trailing_silent_frames

    @property
    def has_speech(self) -> bool:
        return self._has_speech

    def update(
        self,
        emitted: Sequence[bool],
        *,
        blank_probs: Sequence[float] | None = None,
        speech_probs: Sequence[float] | None = None,
    ) -> Endpoint | None:
        """Consume one chunk's frames in order; the endpoint at the first frame where a rule holds, else None.

        The runtime can end at most one utterance per chunk (it finalises at chunk end), so at most one endpoint
        is reported. On firing the endpointer resets and counts the chunk's remaining frames as the start of the
        next utterance; should a rule hold again within them, it is not reported in this chunk but at the next
        chunk's first frame where it still holds (max_utterance always does; the silence rules unless speech
        breaks the silence first).
        """
        silent = self._silent_flags(emitted, blank_probs, speech_probs)
        endpoint = None
        for index, is_silent in enumerate(silent):
            self._utterance_frames += 1
            self._trailing_silent_frames = self._trailing_silent_frames + 1 if is_silent else 0
            self._has_speech = self._has_speech or not is_silent
            if endpoint is None:
                endpoint = self._check(index)
                if endpoint is not None:
                    self.reset()
        return endpoint

    def _check(self, frame: int) -> Endpoint | None:
        for index, (rule, (silent, total)) in enumerate(zip(self.config.rules, self._needs)):
            if (
                (self._has_speech or not rule.must_contain_speech)
                and self._trailing_silent_frames >= silent
                and self._utterance_frames >= total
            ):
                return Endpoint(
                    index,
                    rule,
                    frame,
                    self._utterance_frames * self.frame_s,
                    self._trailing_silent_frames * self.frame_s,
                )
        return None

    def _silent_flags(
        self, emitted: Sequence[bool], blank_probs: Sequence[float] | None, speech_probs: Sequence[float] | None
    ) -> list[bool]:
        # A length mismatch is a runtime bug whichever source is in use, so it is refused even for unused inputs.
        for name, values in (("blank_probs", blank_probs), ("speech_probs", speech_probs)):
            if values is not None and len(values) != len(emitted):
                raise ValueError(f"{name} has {len(values)} frames but emitted has {len(emitted)}")
        config = self.config
        if config.silence_source == "vad":
            if speech_probs is None:
                raise ValueError("silence_source='vad' needs speech_probs, one VAD probability per frame")
            return [p < config.vad_threshold for p in speech_probs]
        if blank_probs is None:
            return [not e for e in emitted]
        # An emitted token is speech whatever its frame's blank posterior.
        return [not e and p >= config.blank_threshold for e, p in zip(emitted, blank_probs)]
