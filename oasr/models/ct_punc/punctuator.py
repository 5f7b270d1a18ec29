"""A CT-Transformer folder loaded as a ``Punctuator``: ``config.yaml``, ``model.pt`` and the token list
(``tokens.json`` or ``tokens.txt``), as FunASR's ``AutoModel(model=DIR)`` reads a ``ct-punc`` folder. Each text is
split into words, looked up in the vocabulary (a word it lacks is ``<unk>``), classified mini-sentence by
mini-sentence (``oasr.models.ct_punc.text``) and written with its marks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from oasr.errors import CheckpointError
from oasr.models.checkpoint import ModelSource
from oasr.models.converters.funasr import read_config, read_tokens, read_weights, token_file
from oasr.models.ct_punc.config import CTPuncConfig, read_config as read_punc_config
from oasr.models.ct_punc.model import CTTransformer
from oasr.models.ct_punc.text import SPLIT_SIZE, punctuate_words, split_words
from oasr.models.punctuation import PUNCTUATORS, PunctuatedText

# A folder shipping jieba's user dictionary is a word-level checkpoint (its Chinese words are jieba's, not
# characters), which these text rules do not segment.
JIEBA_FILE = "jieba_usr_dict"


@PUNCTUATORS.register("ct_transformer")
class CTPunctuator:
    def __init__(self, model: CTTransformer, config: CTPuncConfig, vocabulary: dict[str, int], unk_id: int,
                 device: torch.device) -> None:
        self.model = model
        self.config = config
        self.vocabulary = vocabulary
        self.unk_id = unk_id
        self.device = device

    @classmethod
    def load(cls, folder: Path, device: str = "cpu") -> CTPunctuator:
        source = ModelSource(Path(folder))
        if not (source.directory / "config.yaml").is_file():
            raise CheckpointError(f"{source}: no config.yaml (a FunASR CT-Transformer punctuation folder holds "
                                  "config.yaml, model.pt and tokens.json)")
        if (source.directory / JIEBA_FILE).exists():
            raise CheckpointError(f"{source}: {JIEBA_FILE} marks a word-level CT-Transformer (jieba segmentation); "
                                  "OASR serves character-level ones")
        raw = read_config(source)
        config = read_punc_config(raw, str(source))
        tokens = read_tokens(token_file(source), source)
        unk = (raw.get("tokenizer_conf") or {}).get("unk_symbol", "<unk>")
        vocabulary = {token: index for index, token in enumerate(tokens)}
        if unk not in vocabulary:
            raise CheckpointError(f"{source}: the token list has no {unk!r} (tokenizer_conf.unk_symbol)")
        model = CTTransformer(config, len(tokens))
        load_state(model, read_weights(source), source)
        target = torch.device(device)
        return cls(model.to(target).eval(), config, vocabulary, vocabulary[unk], target)

    def punctuate(self, texts: list[str]) -> list[PunctuatedText]:
        results = []
        with torch.inference_mode():
            for text in texts:
                words = split_words(text)
                ids = [self.vocabulary.get(word, self.unk_id) for word in words]
                results.append(punctuate_words(words, ids, self.classify, self.config.punc_list,
                                               self.config.sentence_end_id, SPLIT_SIZE))
        return results

    def classify(self, word_ids: Sequence[int]) -> list[int]:
        """The likeliest mark after each word of one mini-sentence."""
        ids = torch.tensor([list(word_ids)], dtype=torch.long, device=self.device)
        logits = self.model(ids, torch.tensor([len(word_ids)], device=self.device))
        return logits[0].argmax(dim=-1).tolist()


def load_state(model: CTTransformer, state: dict[str, torch.Tensor], source: ModelSource) -> None:
    """Loads the checkpoint's tensors by name; a missing key or a shape the config does not give is refused."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(f"{source}: model.pt lacks {len(missing)} keys the config needs, e.g. "
                              f"{', '.join(missing[:3])}")
    wrong = [f"{k} {tuple(state[k].shape)} (config: {tuple(v.shape)})" for k, v in expected.items()
             if state[k].shape != v.shape]
    if wrong:
        raise CheckpointError(f"{source}: model.pt's shapes differ from config.yaml and the token list: "
                              f"{'; '.join(wrong[:3])}")
    model.load_state_dict({k: state[k] for k in expected})
