"""Builds the tiny FunASR Conformer of tests/data/funasr/conformer/ (CTC head and attention decoder) with funasr's own
classes, and records how FunASR scores a fixed n-best list of hypotheses on a few shared clips: the goldens of
OASR's attention rescoring (tests/test_funasr_rescore.py).

Run with the oracle venv's python (scripts/setup_oracles.sh makes it), from the repository root:

    /tmp/oracle/funasr/bin/python scripts/funasr_oracle/build_conformer.py tests/data/funasr

FunASR has no attention-rescoring pass of its own: its Conformer decodes by a joint CTC/attention beam search
(``funasr.models.transformer.search.BeamSearch``) whose decoder scorer walks each hypothesis a token at a time
(``TransformerDecoder.score`` -> ``forward_one_step``) and adds the log-probability of the next token, then of
``</s>``. That sum is the score rescoring needs (WeNet's ``attention_rescoring`` computes the same teacher-forced
sum in one pass), so the goldens are:

- ``hypotheses``: per clip, the n-best of FunASR's own beam search (``beam_size`` 4, CTC weight 0.5), the CTC head's
  greedy labels and the empty hypothesis, token ids without ``<s>``/``</s>``, duplicates removed;
- ``decoder_scores``: per hypothesis, the sum ``TransformerDecoder.score`` gives along it, ``</s>`` included. For
  the beam's hypotheses it is checked here against the ``decoder`` score the beam search accumulated, and for
  every hypothesis against one teacher-forced ``TransformerDecoder.forward``;
- ``ctc_scores``: per hypothesis, its CTC log-likelihood, minus FunASR's ``CTC`` loss of it (checked against the
  beam search's ``ctc`` prefix score for the beam's hypotheses);
- ``beam_scores``: the beam search's own totals, for reference;
- ``ctc_greedy``: the CTC head's best label per frame, repeats merged and blanks dropped (FunASR's batched
  ``inference_batch_ctc``).

Nothing here is imported by the tests; CI reads only the JSON and the model folder written here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_models import randomize, read_clips, rounded  # noqa: E402
from configs import FRONTEND, write_am_mvn, write_tokens  # noqa: E402

# FunASR's released Conformer layout (examples/aishell/conformer/conf/conformer_12e_6d_2048_256.yaml) at a tiny
# size: conv2d subsampling (4x), relative positions of the legacy kind (the config names rel_pos and leaves
# rel_pos_type at its default), macaron feed-forwards, a convolution module, swish; a Transformer decoder.
CONFORMER = {
    "model": "Conformer",
    "model_conf": {"ctc_weight": 0.3, "lsm_weight": 0.1, "length_normalized_loss": False},
    "encoder": "ConformerEncoder",
    "encoder_conf": {"output_size": 32, "attention_heads": 4, "linear_units": 48, "num_blocks": 2,
                     "dropout_rate": 0.1, "positional_dropout_rate": 0.1, "attention_dropout_rate": 0.0,
                     "input_layer": "conv2d", "normalize_before": True, "pos_enc_layer_type": "rel_pos",
                     "selfattention_layer_type": "rel_selfattn", "activation_type": "swish",
                     "macaron_style": True, "use_cnn_module": True, "cnn_module_kernel": 15},
    "decoder": "TransformerDecoder",
    "decoder_conf": {"attention_heads": 4, "linear_units": 48, "num_blocks": 2, "dropout_rate": 0.1,
                     "positional_dropout_rate": 0.1, "self_attention_dropout_rate": 0.0,
                     "src_attention_dropout_rate": 0.0},
    "input_size": 80,
    "frontend": "WavFrontend",
    "frontend_conf": {**FRONTEND, "lfr_m": 1, "lfr_n": 1},
    "tokenizer": "CharTokenizer",
    "tokenizer_conf": {"unk_symbol": "<unk>", "split_with_space": True},
    "ctc_conf": {"dropout_rate": 0.0, "ctc_type": "builtin", "reduce": True, "ignore_nan_grad": True},
    "normalize": None,
}
BEAM_SIZE = 4
CTC_WEIGHT = 0.5  # FunASR's default decoding_ctc_weight
BLANK_BIAS = 2.5
EOS_BIAS = 3.0


def build_model(folder: Path):
    from funasr.models.conformer.model import Conformer

    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    config = CONFORMER
    tokens = write_tokens(folder / "tokens.json")
    write_am_mvn(folder / "am.mvn", config["frontend_conf"]["n_mels"], seed=6)
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    parts = {k: v for k, v in config.items() if k not in ("model", "model_conf", "frontend", "frontend_conf",
                                                          "tokenizer", "tokenizer_conf")}
    model = Conformer(**parts, vocab_size=len(tokens), **config["model_conf"])
    randomize(model, seed=17)
    generator = torch.Generator().manual_seed(19)
    with torch.no_grad():  # batch norms with statistics of their own, so that OASR must read them
        for name, buffer in model.named_buffers():
            if name.endswith("running_mean"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
            elif name.endswith("running_var"):
                buffer.copy_(1 + 0.3 * torch.rand(buffer.shape, generator=generator))
        # Blank on most frames and </s> within reach, so that hypotheses end by themselves well before the beam
        # search's length limit (which appends an unscored </s>) and hold a few dozen tokens, not one a frame.
        model.ctc.ctc_lo.bias[model.blank_id] += BLANK_BIAS
        model.decoder.output_layer.bias[model.eos] += EOS_BIAS
    torch.save(model.state_dict(), folder / "model.pt")
    return tokens


def decoder_walk(decoder, hypothesis: list[int], memory: torch.Tensor, sos: int, eos: int) -> float:
    """The sum ``decoder.score`` gives along ``hypothesis`` then ``</s>``, as FunASR's beam search adds it."""
    ys = torch.tensor([sos], dtype=torch.long)
    state, total = None, 0.0
    for token in [*hypothesis, eos]:
        logp, state = decoder.score(ys, state, memory)
        total += float(logp[token])
        ys = torch.cat([ys, torch.tensor([token])])
    return total


def decoder_forward(decoder, hypotheses: list[list[int]], encoder_out, encoder_lens, sos: int, eos: int):
    """The same sums from one teacher-forced ``decoder.forward`` over the padded hypotheses."""
    longest = max(len(h) for h in hypotheses) + 1
    ys_in = torch.full((len(hypotheses), longest), eos, dtype=torch.long)
    for i, h in enumerate(hypotheses):
        ys_in[i, : len(h) + 1] = torch.tensor([sos, *h])
    lens = torch.tensor([len(h) + 1 for h in hypotheses])
    n = len(hypotheses)
    logits, _ = decoder(encoder_out.expand(n, -1, -1), encoder_lens.expand(n), ys_in, lens)
    logp = logits.log_softmax(-1)
    return [float(sum(logp[i, j, t] for j, t in enumerate([*h, eos]))) for i, h in enumerate(hypotheses)]


def ctc_log_likelihood(model, encoder_out, encoder_lens, hypothesis: list[int]) -> float:
    """Minus FunASR's CTC loss of one hypothesis (its ``CTC`` module sums over the batch of one)."""
    ys = torch.tensor([hypothesis or [0]], dtype=torch.long)
    lens = torch.tensor([len(hypothesis)])
    return -float(model.ctc(encoder_out, encoder_lens, ys, lens))


def score_clip(model, frontend, audio: np.ndarray, tokens: list[str]) -> dict:
    feats, lengths = frontend(torch.from_numpy(audio)[None, :], torch.tensor([len(audio)]))
    with torch.no_grad():
        encoder_out, encoder_lens = model.encode(feats, lengths)
        beam = model.beam_search(x=encoder_out[0], maxlenratio=0.0, minlenratio=0.0)
        greedy = torch.unique_consecutive(model.ctc.log_softmax(encoder_out)[0].argmax(-1))
        greedy = [int(t) for t in greedy if t != model.blank_id]
        hypotheses, beam_scores = [], []
        for hyp in beam[:BEAM_SIZE]:
            ids = [int(t) for t in hyp.yseq[1:-1]]
            hypotheses.append(ids)
            beam_scores.append({k: float(v) for k, v in hyp.scores.items()})
        for extra in (greedy, []):
            if extra not in hypotheses:
                hypotheses.append(extra)
        walked = [decoder_walk(model.decoder, h, encoder_out[0], model.sos, model.eos) for h in hypotheses]
        forward = decoder_forward(model.decoder, hypotheses, encoder_out, encoder_lens, model.sos, model.eos)
        ctc = [ctc_log_likelihood(model, encoder_out, encoder_lens, h) for h in hypotheses]
    np.testing.assert_allclose(walked, forward, atol=1e-4)
    for i, scores in enumerate(beam_scores):
        np.testing.assert_allclose(walked[i], scores["decoder"], atol=1e-4)
        np.testing.assert_allclose(ctc[i], scores["ctc"], atol=1e-3)
    return {"num_encoder_frames": int(encoder_lens[0]), "ctc_greedy": greedy, "hypotheses": hypotheses,
            "decoder_scores": rounded(walked), "ctc_scores": rounded(ctc), "beam_scores": beam_scores,
            "texts": ["".join(tokens[t] for t in h) for h in hypotheses]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    clips = read_clips()
    folder = args.out / "conformer"
    tokens = build_model(folder)

    from funasr import AutoModel

    auto = AutoModel(model=str(folder), device="cpu", disable_update=True, disable_pbar=True, log_level="ERROR")
    model, frontend = auto.model, auto.kwargs["frontend"]
    model.eval()
    model.init_beam_search(token_list=tokens, beam_size=BEAM_SIZE, decoding_ctc_weight=CTC_WEIGHT)
    golden = {"clips": list(clips), "beam_size": BEAM_SIZE, "ctc_weight": CTC_WEIGHT, "sos": model.sos,
              "eos": model.eos, "results": {}}
    for name, audio in clips.items():
        golden["results"][name] = score_clip(model, frontend, audio, tokens)
        result = golden["results"][name]
        print(name, result["num_encoder_frames"], [len(h) for h in result["hypotheses"]], result["decoder_scores"])
    (args.out / "conformer.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
