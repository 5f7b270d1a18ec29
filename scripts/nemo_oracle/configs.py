"""The tiny models' configs, in NeMo's ``model_config.yaml`` layout, and their SentencePiece tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch

TEXT = (
    "and so my fellow americans ask not what your country can do for you",
    "ask what you can do for your country",
    "the quick brown fox jumps over the lazy dog",
    "we choose to go to the moon in this decade and do the other things",
)
VOCAB_SIZE = 48
MELS = 16
D_MODEL = 32
HIDDEN = 24  # prediction network and joint width


def write_tokenizer(directory: Path, special_tokens: tuple[str, ...] = ()) -> Path:
    """A BPE SentencePiece model trained on ``TEXT`` (identity normalisation keeps the file a few kB), with the
    vocab.txt NeMo's BPE tokenizer config points at. ``special_tokens`` become user-defined pieces (Canary's)."""
    corpus = directory / "text.txt"
    corpus.write_text("\n".join(TEXT) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(directory / "tokenizer"), vocab_size=VOCAB_SIZE + len(special_tokens),
        model_type="bpe", character_coverage=1.0, normalization_rule_name="identity", minloglevel=2,
        user_defined_symbols=list(special_tokens), bos_id=-1, eos_id=-1,
    )
    processor = spm.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    (directory / "vocab.txt").write_text("".join(p + "\n" for p in pieces))
    corpus.unlink()
    return directory


def preprocessor(normalize: str = "per_feature") -> dict[str, Any]:
    return dict(_target_="nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor", sample_rate=16000,
                normalize=normalize, window_size=0.025, window_stride=0.01, window="hann", features=MELS, n_fft=512,
                log=True, frame_splicing=1, dither=1e-5, pad_to=0, pad_value=0.0)


def encoder(**overrides: Any) -> dict[str, Any]:
    values = dict(_target_="nemo.collections.asr.modules.ConformerEncoder", feat_in=MELS, feat_out=-1, n_layers=2,
                  d_model=D_MODEL, subsampling="dw_striding", subsampling_factor=8, subsampling_conv_channels=8,
                  ff_expansion_factor=2, self_attention_model="rel_pos", n_heads=4, att_context_size=[-1, -1],
                  xscaling=True, untie_biases=True, pos_emb_max_len=5000, conv_kernel_size=5,
                  conv_norm_type="batch_norm", dropout=0.0, dropout_pre_encoder=0.0, dropout_emb=0.0,
                  dropout_att=0.0)
    values.update(overrides)
    return values


def ctc_decoder() -> dict[str, Any]:
    return dict(_target_="nemo.collections.asr.modules.ConvASRDecoder", feat_in=D_MODEL, num_classes=-1,
                vocabulary=[])


def transducer_parts(durations: list[int] | None = None) -> dict[str, Any]:
    joint = dict(_target_="nemo.collections.asr.modules.RNNTJoint", log_softmax=None, preserve_memory=False,
                 fuse_loss_wer=False, jointnet=dict(joint_hidden=HIDDEN, activation="relu", dropout=0.0))
    decoding: dict[str, Any] = dict(strategy="greedy_batch", greedy=dict(max_symbols=5))
    loss: dict[str, Any] = dict(loss_name="default")
    if durations is not None:
        joint["num_extra_outputs"] = len(durations)
        decoding.update(model_type="tdt", durations=durations)
        loss = dict(loss_name="tdt", tdt_kwargs=dict(durations=durations, sigma=0.02, omega=0.1))
    return dict(
        model_defaults=dict(enc_hidden=D_MODEL, pred_hidden=HIDDEN, joint_hidden=HIDDEN),
        decoder=dict(_target_="nemo.collections.asr.modules.RNNTDecoder", normalization_mode=None,
                     random_state_sampling=False, blank_as_pad=True,
                     prednet=dict(pred_hidden=HIDDEN, pred_rnn_layers=1, t_max=None, dropout=0.0)),
        joint=joint, decoding=decoding, loss=loss,
    )


def _base(tokenizer_dir: str, **parts: Any) -> dict[str, Any]:
    return dict(sample_rate=16000, tokenizer=dict(dir=tokenizer_dir, type="bpe"), preprocessor=preprocessor(),
                encoder=encoder(), **parts)


def _nothing(model: torch.nn.Module) -> None:
    pass


def _sharpen_ctc(model: torch.nn.Module) -> None:
    """A steeper head than unit gain, so frames disagree, and a lower blank, so some of them emit."""
    with torch.no_grad():
        head = model.decoder.decoder_layers[0]
        head.weight.mul_(4.0)
        head.bias[-1] -= 1.0


def _raise_transducer_blank(head_gain: float, boost: float) -> Callable[[torch.nn.Module], None]:
    """A steeper joint head and a higher blank logit (the values the committed archives were built with; no
    setting tried made the tiny RNN-T stop repeating its first tokens, see the report)."""

    def adjust(model: torch.nn.Module) -> None:
        with torch.no_grad():
            head = model.joint.joint_net[-1]
            head.weight.mul_(head_gain)
            head.bias[model.joint.num_classes_with_blank - 1] += boost

    return adjust


@dataclass(frozen=True)
class Family:
    name: str
    class_name: str  # in nemo.collections.asr.models
    config: Callable[[str], dict[str, Any]]
    seed: int
    adjust: Callable[[torch.nn.Module], None] = _nothing  # after randomize: bias the output so it varies
    special_tokens: tuple[str, ...] = ()
    transcribe_kwargs: dict[str, Any] = field(default_factory=dict)
    prompts: tuple[dict[str, Any], ...] = ()  # a multitask model's prompts, each recorded with its own tokens
    fitted: bool = False  # trained briefly on the clips (fit.py) instead of having its output biased
    streaming: Callable[[torch.nn.Module, Any], list[int]] | None = None

    def ctc_blank(self, model: torch.nn.Module) -> int | None:
        """The blank id when NeMo transcribes through its CTC head (its last class), else None."""
        return model.decoder.num_classes_with_blank - 1 if self.class_name == "EncDecCTCModelBPE" else None

    def model_class(self) -> type:
        import nemo.collections.asr.models as models

        return getattr(models, self.class_name)


def _streaming(tokenizer_dir: str) -> dict[str, Any]:
    """Cache-aware FastConformer (Nemotron's layout): attention in chunks of 3 frames with 2 chunks of left
    context, causal subsampling and convolutions, layer-normed convolution modules, no feature normalisation."""
    values = _base(tokenizer_dir, **transducer_parts())
    values["preprocessor"] = preprocessor(normalize="NA")
    values["encoder"] = encoder(att_context_size=[6, 2], att_context_style="chunked_limited",
                                causal_downsampling=True, conv_context_size="causal", conv_norm_type="layer_norm")
    return values


def _streamed(model: torch.nn.Module, clip: Any) -> list[int]:
    from streaming import streamed_tokens

    return streamed_tokens(model, clip)


# Canary-1B-v2's prompt pieces (NeMo's CanaryTokenizer.DEFAULT_TOKENS first, as its tokenizer has them right after
# <unk>), and four languages so a prompt can ask for a translation.
CANARY_SPECIAL_TOKENS = (
    "<|nospeech|>", "<pad>", "<|endoftext|>", "<|startoftranscript|>", "<|pnc|>", "<|nopnc|>", "<|startofcontext|>",
    "<|itn|>", "<|noitn|>", "<|timestamp|>", "<|notimestamp|>", "<|diarize|>", "<|nodiarize|>", "<|emo:undefined|>",
    "<|en|>", "<|de|>", "<|es|>", "<|fr|>",
)
# Transcription, and translation into German (both with punctuation), as NeMo's transcribe() takes them.
CANARY_PROMPTS = (dict(source_lang="en", target_lang="en", pnc="yes"), dict(source_lang="en", target_lang="de", pnc="yes"))
CANARY_DECODER_LAYERS = 2
CANARY_MAX_POSITIONS = 96


def _canary(tokenizer_dir: str) -> dict[str, Any]:
    """Canary-1B-v2's layout (prompt format ``canary2``, one SentencePiece model read by ``CanaryBPETokenizer``, a
    pre-LN transformer decoder with fixed sinusoidal positions, the vocabulary head tied to the token embedding),
    at the tiny encoder's width. No external timestamps model: the real archive carries one for forced alignment."""
    values = _base(tokenizer_dir)
    values["tokenizer"]["custom_tokenizer"] = dict(
        _target_="nemo.collections.common.tokenizers.canary_tokenizer.CanaryBPETokenizer")
    slots = dict(decodercontext="", emotion="<|emo:undefined|>", itn="<|noitn|>", timestamp="<|notimestamp|>",
                 diarize="<|nodiarize|>", pnc="<|pnc|>")
    values.update(
        prompt_format="canary2",
        prompt_defaults=[dict(role="user", slots=slots)],
        restore_timestamps_model=False,
        model_defaults=dict(asr_enc_hidden=D_MODEL, lm_enc_hidden=D_MODEL, lm_dec_hidden=D_MODEL),
        transf_encoder=dict(_target_="nemo.collections.asr.modules.transformer.transformer_encoders.TransformerEncoder",
                            num_layers=0, hidden_size=D_MODEL, inner_size=64, num_attention_heads=4),
        transf_decoder=dict(
            _target_="nemo.collections.asr.modules.transformer.get_nemo_transformer", model_name=None,
            pretrained=False, encoder=False, pre_ln_final_layer_norm=True,
            config_dict=dict(max_sequence_length=CANARY_MAX_POSITIONS, num_token_types=0, embedding_dropout=0.0,
                             learn_positional_encodings=False, hidden_size=D_MODEL, inner_size=64,
                             num_layers=CANARY_DECODER_LAYERS, num_attention_heads=4, ffn_dropout=0.0,
                             attn_score_dropout=0.0, attn_layer_dropout=0.0, hidden_act="relu", pre_ln=True,
                             vocab_size=None),
        ),
        head=dict(_target_="nemo.collections.asr.parts.submodules.token_classifier.TokenClassifier", num_layers=1,
                  activation="relu", log_softmax=True, hidden_size=D_MODEL, num_classes=None, dropout=0.0,
                  use_transformer_init=True),
        decoding=dict(strategy="greedy", greedy=dict(max_generation_delta=-1, temperature=None, n_samples=1)),
        loss=dict(_target_="nemo.collections.common.losses.smoothed_cross_entropy.SmoothedCrossEntropyLoss",
                  label_smoothing=0.0, pad_id=None),
    )
    return values


def _hybrid(tokenizer_dir: str) -> dict[str, Any]:
    return _base(tokenizer_dir, **transducer_parts(),
                 aux_ctc=dict(ctc_loss_weight=0.3, decoder=ctc_decoder(), decoding=dict(strategy="greedy_batch")))


FAMILIES: tuple[Family, ...] = (
    Family("ctc", "EncDecCTCModelBPE", lambda d: _base(d, decoder=ctc_decoder()), seed=1, adjust=_sharpen_ctc),
    Family("rnnt", "EncDecRNNTBPEModel", lambda d: _base(d, **transducer_parts()), seed=2, fitted=True),
    Family("tdt", "EncDecRNNTBPEModel", lambda d: _base(d, **transducer_parts([0, 1, 2, 3, 4])), seed=3),
    Family("hybrid", "EncDecHybridRNNTCTCBPEModel", _hybrid, seed=4, adjust=_raise_transducer_blank(3.0, 3.0)),
    Family("canary", "EncDecMultiTaskModel", _canary, seed=6, special_tokens=CANARY_SPECIAL_TOKENS,
           transcribe_kwargs=CANARY_PROMPTS[0], prompts=CANARY_PROMPTS, fitted=True),
    Family("streaming", "EncDecRNNTBPEModel", _streaming, seed=5, adjust=_raise_transducer_blank(1.0, 1.0), streaming=_streamed),
)
