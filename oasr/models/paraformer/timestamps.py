"""Token timestamps from the CIF predictor, as FunASR's ``ts_prediction_lfr6_standard`` computes them for
Paraformer (upsample rate 1: one encoder frame is 60 ms).

Paraformer's inference hands that function the predictor's fire curve where it expects the weights and the
weights where it expects the fire curve. So the fire places are the frames whose *weight* reaches 1 - 1e-4; when
those are not one more than the tokens (almost always), the fire curve is rescaled to sum to tokens + 1 and
integrated again, and its crossings are the places. Each token spans from its place to the next, shifted back
1.5 frames; a token longer than 12 frames is cut there (the rest is silence), leading and trailing silence of
more than 5 frames is kept out of the first and last token. OASR keeps all of this, so its times equal FunASR's.
Host code on CPU tensors of one row, in float32 like FunASR's.
"""

from __future__ import annotations

import numpy as np
import torch

START_END_THRESHOLD = 5  # frames of leading or trailing silence kept out of the first and last token
MAX_TOKEN_DURATION = 12  # frames; a longer token is cut here and the rest marked silence
FORCE_TIME_SHIFT = -1.5  # frames: fire places are moved back this much
SECONDS_PER_FRAME = 10.0 * 6 / 1000  # LFR frames of six 10 ms hops
FIRE_LEVEL = 1.0 - 1e-4


def integrate(weights: torch.Tensor, threshold: float) -> torch.Tensor:
    """FunASR's ``cif_wo_hidden`` for one row: the running sum before each subtraction of ``threshold``."""
    total = torch.zeros(1, dtype=weights.dtype)
    sums = []
    for weight in weights:
        total = total + weight
        sums.append(total)
        total = torch.where(total >= threshold, total - threshold, total)
    return torch.cat(sums) if sums else weights.new_zeros(0)


def token_spans(fires: torch.Tensor, alphas: torch.Tensor, tokens: list[str]) -> list[list[int]]:
    """fires, alphas: one row's CIF curves [T + 1] (the tail frame included); tokens: the row's token strings
    -> [start_ms, end_ms] of each token (FunASR's per-token ``timestamp`` before words are formed)."""
    if not tokens:
        return []
    if tokens[-1] == "</s>":
        tokens = tokens[:-1]
    curve = alphas.float().cpu()
    places = torch.where(curve >= FIRE_LEVEL)[0].numpy() + FORCE_TIME_SHIFT
    if len(places) != len(tokens) + 1:
        rescaled = fires.float().cpu() / (fires.float().cpu().sum() / (len(tokens) + 1))
        curve = integrate(rescaled, FIRE_LEVEL)
        places = torch.where(curve >= FIRE_LEVEL)[0].numpy() + FORCE_TIME_SHIFT
    if len(places) == 0:
        return []
    return _spans(places, int(curve.shape[0]), tokens)


def _spans(places: np.ndarray, num_frames: int, tokens: list[str]) -> list[list[int]]:
    rate = SECONDS_PER_FRAME
    stamps: list[list[float]] = []
    labels: list[str] = []
    if places[0] > START_END_THRESHOLD:
        stamps.append([0.0, places[0] * rate])
        labels.append("<sil>")
    for i in range(len(places) - 1):
        labels.append(tokens[i])
        if places[i + 1] - places[i] <= MAX_TOKEN_DURATION:
            stamps.append([places[i] * rate, places[i + 1] * rate])
        else:
            cut = places[i] + MAX_TOKEN_DURATION
            stamps.append([places[i] * rate, cut * rate])
            stamps.append([cut * rate, places[i + 1] * rate])
            labels.append("<sil>")
    if num_frames - places[-1] > START_END_THRESHOLD:
        end = (num_frames + places[-1]) * 0.5
        stamps[-1][1] = end * rate
        stamps.append([end * rate, num_frames * rate])
        labels.append("<sil>")
    elif stamps:
        stamps[-1][1] = num_frames * rate
    return [[int(start * 1000), int(stop * 1000)] for label, (start, stop) in zip(labels, stamps) if label != "<sil>"]
