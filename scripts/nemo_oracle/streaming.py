"""NeMo's cache-aware streaming loop over one clip (as NeMo's examples/asr/asr_cache_aware_streaming script runs
it): the encoder's default chunking (lookahead = its att_context_size's right context), features of the whole
clip cut into chunks by ``CacheAwareStreamingAudioBuffer``, greedy RNN-T hypotheses carried across chunks."""

from __future__ import annotations

import numpy as np
import torch


def streamed_tokens(model: torch.nn.Module, clip: np.ndarray) -> list[int]:
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

    buffer = CacheAwareStreamingAudioBuffer(model=model, online_normalization=False, pad_and_drop_preencoded=False)
    buffer.append_audio(clip.astype(np.float32))
    channel, time, channel_len = model.encoder.get_initial_cache_state(batch_size=1)
    hypotheses = None
    predictions = None
    for step, (chunk, lengths) in enumerate(iter(buffer)):
        drop = model.encoder.streaming_cfg.drop_extra_pre_encoded if step != 0 else 0
        predictions, _, channel, time, channel_len, hypotheses = model.conformer_stream_step(
            processed_signal=chunk, processed_signal_length=lengths, cache_last_channel=channel,
            cache_last_time=time, cache_last_channel_len=channel_len, keep_all_outputs=buffer.is_buffer_empty(),
            previous_hypotheses=hypotheses, previous_pred_out=predictions, drop_extra_pre_encoded=drop,
            return_transcription=True,
        )
    return [int(t) for t in hypotheses[0].y_sequence]
