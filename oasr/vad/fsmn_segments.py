"""FunASR's FSMN-VAD segment logic (``E2EVadModel`` in ``fsmn_vad_streaming``) for the default configuration:
multiple-utterance mode, start look-back and end look-ahead on, one silence state. Pure Python on per-frame
silence probabilities and frame loudness, so it runs and is tested without the network.

A 200 ms window of frame states switches silence to speech when 150 ms of it is speech, and back when no more
than 150 ms is. A segment starts the window plus the look-back before the frame that switched it (never before
the frames already handed out), and ends once the silence run reaches ``max_end_silence_ms - speech_to_sil_ms``,
the end pulled back to leave the look-ahead; the last frame of the input ends an open segment. After each end
the detector resets and looks for the next start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

SPEECH, SILENCE = 1, 0
START_NOT_DETECTED, IN_SPEECH, END_DETECTED = 0, 1, 2


@dataclass(frozen=True)
class FsmnSegmentConfig:
    """FunASR's ``model_conf`` fields the default configuration reads (milliseconds unless named otherwise)."""

    frame_ms: int = 10
    window_ms: int = 200
    sil_to_speech_ms: int = 150
    speech_to_sil_ms: int = 150
    max_end_silence_ms: int = 800
    max_single_segment_ms: int = 60000
    lookback_start_ms: int = 200
    lookahead_end_ms: int = 100
    speech_noise_thres: float = 0.6
    decibel_thres: float = -100.0
    snr_thres: float = -100.0
    noise_frames_for_snr: int = 100

    @classmethod
    def from_model_conf(cls, conf: dict) -> FsmnSegmentConfig:
        return cls(frame_ms=int(conf.get("frame_in_ms", 10)), window_ms=int(conf.get("window_size_ms", 200)),
                   sil_to_speech_ms=int(conf.get("sil_to_speech_time_thres", 150)),
                   speech_to_sil_ms=int(conf.get("speech_to_sil_time_thres", 150)),
                   max_end_silence_ms=int(conf.get("max_end_silence_time", 800)),
                   max_single_segment_ms=int(conf.get("max_single_segment_time", 60000)),
                   lookback_start_ms=int(conf.get("lookback_time_start_point", 200)),
                   lookahead_end_ms=int(conf.get("lookahead_time_end_point", 100)),
                   speech_noise_thres=float(conf.get("speech_noise_thres", 0.6)),
                   decibel_thres=float(conf.get("decibel_thres", -100.0)),
                   snr_thres=float(conf.get("snr_thres", -100.0)),
                   noise_frames_for_snr=int(conf.get("noise_frame_num_used_for_snr", 100)))


# FunASR's calls (offline: one chunk of up to 60 s; streaming: piece by piece) shorten the end silence by how long
# speech has lasted and lower the speech threshold to 0.5 ("dynamic silence", ``DEFAULT_SILENCE_SCHEDULE``):
# (speech so far up to this many ms, end silence in ms). A whole clip of under 10 s gets the first entry.
DYNAMIC_SILENCE_SCHEDULE: tuple[tuple[float, int], ...] = (
    (10_000, 2000), (20_000, 1000), (30_000, 800), (40_000, 600), (50_000, 400), (60_000, 200), (float("inf"), 100))
DYNAMIC_FIRST_END_SILENCE_MS = DYNAMIC_SILENCE_SCHEDULE[0][1]
DYNAMIC_SPEECH_NOISE_THRES = 0.5


def frame_decibels(audio: Sequence[float] | np.ndarray, num_frames: int, frame_length: int = 400, hop: int = 160
                   ) -> list[float]:
    """10 log10 of each 25 ms frame's energy (float samples), as FunASR's ``ComputeDecibel``."""
    samples = np.asarray(audio, dtype=np.float32)
    offsets = np.arange(num_frames)[:, None] * hop + np.arange(frame_length)[None, :]
    frames = samples[offsets]
    return (10 * np.log10(np.sum(np.square(frames), axis=1) + 0.000001)).tolist()


class FsmnSegmenter:
    """One stream's state machine; ``run(silence_probs, decibels)`` -> ``[[start_ms, end_ms], ...]`` for a whole
    input whose last frame is final."""

    def __init__(self, config: FsmnSegmentConfig) -> None:
        self.config = config
        c = config
        self.window_frames = c.window_ms // c.frame_ms
        self.to_speech_frames = c.sil_to_speech_ms // c.frame_ms
        self.to_silence_frames = c.speech_to_sil_ms // c.frame_ms
        self.start_latency = self.window_frames + c.lookback_start_ms // c.frame_ms
        self.max_end_silence = c.max_end_silence_ms - c.speech_to_sil_ms
        self.segments: list[list[int]] = []
        self.next_free_frame = 0  # FunASR's data_buf_start_frame: frames before it are handed out or dropped
        self.noise_decibel = -100.0
        self.ends_detected = 0
        self.num_frames = 0  # frames fed so far (``feed``)
        self.num_closed = 0  # segments whose end has been found
        self.num_reported = (0, 0)  # segments whose start, and whose end, ``feed`` has reported
        self.reset()

    def reset(self) -> None:
        self.window = [0] * self.window_frames
        self.window_sum = 0
        self.window_pos = 0
        self.window_state = SILENCE
        self.silence_run = 0
        self.last_speech_frame = 0
        self.start_frame = -1
        self.state = START_NOT_DETECTED

    def retune(self, max_end_silence_ms: int, speech_noise_thres: float) -> None:
        """New end-silence and speech thresholds from the next frame on (FunASR's dynamic silence)."""
        self.config = replace(self.config, max_end_silence_ms=max_end_silence_ms,
                              speech_noise_thres=speech_noise_thres)
        self.max_end_silence = max(max_end_silence_ms - self.config.speech_to_sil_ms, 0)

    def frame_state(self, silence: float, decibel: float) -> int:
        c = self.config
        if decibel < c.decibel_thres:
            return SILENCE
        snr = decibel - self.noise_decibel
        if 1.0 - silence >= silence + c.speech_noise_thres:
            return SPEECH if snr >= c.snr_thres and decibel >= c.decibel_thres else SILENCE
        self.noise_decibel = (decibel if self.noise_decibel < -99.9 else
                              (decibel + self.noise_decibel * (c.noise_frames_for_snr - 1)) / c.noise_frames_for_snr)
        return SILENCE

    def run(self, silence_probs: list[float], decibels: list[float]) -> list[list[int]]:
        for index, (silence, decibel) in enumerate(zip(silence_probs, decibels)):
            self.step(self.frame_state(silence, decibel), index, index == len(silence_probs) - 1)
        return self.segments

    def feed(self, silence_probs: list[float], decibels: list[float], final: bool) -> list[list[int]]:
        """The next frames of a stream (the last of them final if ``final``) -> FunASR's streaming events for
        them: ``[start_ms, -1]`` a segment began, ``[-1, end_ms]`` the open one ended, ``[start_ms, end_ms]``
        both within these frames (``FsmnVADStreaming.forward`` with ``is_streaming_input``)."""
        for offset, (silence, decibel) in enumerate(zip(silence_probs, decibels)):
            last = final and offset == len(silence_probs) - 1
            self.step(self.frame_state(silence, decibel), self.num_frames + offset, last)
        self.num_frames += len(silence_probs)
        events = []
        started, ended = self.num_reported
        for index in range(min(started, ended), len(self.segments)):
            new_start, new_end = index >= started, index < self.num_closed and index >= ended
            if new_start or new_end:
                events.append([self.segments[index][0] if new_start else -1,
                               self.segments[index][1] if index < self.num_closed else -1])
        self.num_reported = (len(self.segments), self.num_closed)
        return events

    def slide(self, state: int) -> str:
        self.window_sum += state - self.window[self.window_pos]
        self.window[self.window_pos] = state
        self.window_pos = (self.window_pos + 1) % self.window_frames
        if self.window_state == SILENCE and self.window_sum >= self.to_speech_frames:
            self.window_state = SPEECH
            return "sil2speech"
        if self.window_state == SPEECH and self.window_sum <= self.to_silence_frames:
            self.window_state = SILENCE
            return "speech2sil"
        return "sil2sil" if self.window_state == SILENCE else "speech2speech"

    def emit(self, frame: int, starts: bool = False) -> None:
        """FunASR's ``PopDataToOutputBuf`` for one frame: opens a segment or extends the open one."""
        if starts or not self.segments:
            self.segments.append([frame * self.config.frame_ms, frame * self.config.frame_ms])
        self.next_free_frame += 1
        self.segments[-1][1] = (frame + 1) * self.config.frame_ms

    def voice(self, frame: int) -> None:
        self.last_speech_frame = frame
        self.emit(frame)

    def voice_start(self, frame: int, fake: bool = False) -> None:
        self.start_frame = frame
        if not fake and self.state == START_NOT_DETECTED:
            self.next_free_frame = max(self.next_free_frame, frame)
            self.emit(frame, starts=True)

    def voice_end(self, frame: int, fake: bool) -> None:
        for t in range(self.last_speech_frame + 1, frame):
            self.voice(t)
        if not fake:
            self.emit(frame)
            self.num_closed = len(self.segments)
        self.ends_detected += 1
        self.state = END_DETECTED

    def too_long(self, frame: int) -> bool:
        return frame - self.start_frame + 1 > self.config.max_single_segment_ms / self.config.frame_ms

    def continue_speech(self, frame: int, final: bool) -> None:
        if self.too_long(frame):
            self.voice_end(frame, fake=False)
        elif not final:
            self.voice(frame)
        else:
            self.voice_end(frame, fake=False)

    def step(self, state: int, frame: int, final: bool) -> None:
        change = self.slide(state)
        if change == "sil2speech":
            self.silence_run = 0
            if self.state == START_NOT_DETECTED:
                start = max(self.next_free_frame, frame - self.start_latency)
                self.voice_start(start)
                self.state = IN_SPEECH
                for t in range(start + 1, frame + 1):
                    self.voice(t)
            elif self.state == IN_SPEECH:
                for t in range(self.last_speech_frame + 1, frame):
                    self.voice(t)
                self.continue_speech(frame, final)
        elif change in ("speech2sil", "speech2speech"):
            self.silence_run = 0
            if self.state == IN_SPEECH:
                self.continue_speech(frame, final)
        else:
            self.silence_run += 1
            self.silence(frame, final)
        if self.state == END_DETECTED:
            self.reset()

    def silence(self, frame: int, final: bool) -> None:
        c = self.config
        if self.state == START_NOT_DETECTED:
            if final and self.ends_detected == 0:
                self.voice_start(0, fake=True)
                self.voice_end(0, fake=True)
            elif frame >= self.start_latency:
                # OnSilenceDetected: frames up to here are silence and no segment will start before them.
                self.next_free_frame = max(self.next_free_frame, frame - self.start_latency)
        elif self.state == IN_SPEECH:
            if self.silence_run * c.frame_ms >= self.max_end_silence:
                back = max(0, self.max_end_silence // c.frame_ms - c.lookahead_end_ms // c.frame_ms - 1)
                self.voice_end(frame - back, fake=False)
            elif self.too_long(frame):
                self.voice_end(frame, fake=False)
            elif not final:
                if self.silence_run <= c.lookahead_end_ms // c.frame_ms:
                    self.voice(frame)
            else:
                self.voice_end(frame, fake=False)


class DynamicSilence:
    """FunASR's streaming schedule (``FsmnVADStreaming.inference``): before each piece of ``piece_ms``, the end
    silence is chosen by how much speech has gone by since the last event, counted in whole pieces while a
    segment is open; any event (a start or an end) starts the count again."""

    def __init__(self, piece_ms: int, schedule: tuple[tuple[float, int], ...] = DYNAMIC_SILENCE_SCHEDULE) -> None:
        self.piece_ms = piece_ms
        self.schedule = schedule
        self.speech_ms = 0
        self.in_speech = False

    def before_piece(self, segmenter: FsmnSegmenter) -> None:
        if segmenter.state == IN_SPEECH or self.in_speech:
            self.speech_ms += self.piece_ms
            self.in_speech = True
        silence_ms = next(silence for limit, silence in self.schedule if self.speech_ms <= limit)
        segmenter.retune(silence_ms, DYNAMIC_SPEECH_NOISE_THRES)

    def after_piece(self, events: list[list[int]]) -> None:
        if events:
            self.speech_ms, self.in_speech = 0, False
