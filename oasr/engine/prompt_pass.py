"""The autoregressive runner's encode walk: features -> encoder -> cross-attention K/V -> [detection pre-pass]
-> prompts -> each row's first token (and the first step of its beam search).

A model whose prompt carries the audio (``DecoderSpec.prompt_audio``) has no cross-attention K/V: its prompts run
as embeddings, the encoder's output of each row in place of the row's audio positions (``Prompt.audio_index``).

Model specifics come from the seam objects only: the prompt builder says which rows need a pre-pass
(``Detection``: the decoder reads its tokens and the likeliest candidate names what it found, as Whisper's
language) and what each prompt is, and where the no-speech probability is read.

The runner hands the walk, once, every object it reads or writes (the model and its seam objects, the pools and
per-slot state); the walk does device work only. The runner's host copies of its slots (how much of each block
table is on the device, which slots use timestamps or sampling) stay with the runner, which writes the encode
rows' block tables before the walk and flags their slots after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from oasr.decode.aed_greedy import AEDGreedy, AEDRowState
from oasr.decode.hotwords import ContextGraphCache
from oasr.decode.timestamp_rules import TimestampState
from oasr.engine.aed_beams import BeamRows, BeamTick
from oasr.engine.contracts import AutoregressiveModel
from oasr.engine.cross_cache import NoCrossStore, PagedCrossStore, SlotCrossStore
from oasr.engine.kv_cache import PagedKVPool, paged_context
from oasr.engine.request import Request
from oasr.engine.slot_state import SlotState
from oasr.engine.staging import AudioStager
from oasr.engine.step import BeamResult, EncodeResult, EncodeRow
from oasr.features import FeatureExtractor
from oasr.layers.cache import CrossAttentionCache
from oasr.models.base import Prompt, PromptBuilder
from oasr.uploads import upload, upload_tensor


def length_groups(lengths: list[int], slack: float = 0.125) -> list[list[int]]:
    """Row indices grouped by length, longest first: a row joins the current group while padding it to the
    group's longest wastes at most ``slack`` of that length (tensor-free, host ints)."""
    groups: list[list[int]] = []
    width = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if not groups or lengths[i] < (1.0 - slack) * width:
            groups.append([])
            width = lengths[i]
        groups[-1].append(i)
    return groups


class PromptPass:
    def __init__(self, *, model: AutoregressiveModel, prompter: PromptBuilder, strategy: AEDGreedy,
                 features: FeatureExtractor, audio_positions: Callable[[int], int], stager: AudioStager | None,
                 pool: PagedKVPool, cross: NoCrossStore | SlotCrossStore | PagedCrossStore, state: SlotState,
                 beams: BeamRows, contexts: ContextGraphCache, device: torch.device, compile_encoder: bool) -> None:
        """``audio_positions``: prompt positions a request's audio takes, from its feature frames (the runner's
        rule, which it also sizes prompts by); ``contexts``: the automata of the hotword lists beam searches
        name; ``compile_encoder``: run the encoder through ``torch.compile``, one graph for any number of rows."""
        self.model = model
        self.prompter = prompter
        self.strategy = strategy
        self.features = features
        self.audio_positions = audio_positions
        self.stager = stager
        self.pool = pool
        self.cross = cross
        self.state = state
        self.beams = beams
        self.contexts = contexts
        self.device = device
        self.splices_audio = model.decoder_spec.prompt_audio is not None
        self.compile_encoder = compile_encoder
        self.encoder = torch.compile(model.encode) if compile_encoder else model.encode

    def run(self, rows: tuple[EncodeRow, ...], requests: Mapping[str, Request]
            ) -> tuple[dict[str, EncodeResult], dict[str, BeamResult]]:
        """Encodes ``rows`` and runs their prompts, whose slots' block tables are on the device already."""
        batch = [requests[row.request_id] for row in rows]
        features, lengths = self._features(batch)
        if self.compile_encoder:
            torch._dynamo.mark_dynamic(features, 0)  # any number of rows, one compiled graph
        encoded = self.encoder(features, lengths)
        cross = self.cross.write(self.model, rows, encoded.hidden, [q.num_cross_positions for q in batch])
        (slots,) = upload(self.device, [row.slots[0] for row in rows])
        detected = self._detect(batch, slots, cross)
        audio_lengths = [self.audio_positions(q.num_frames) for q in batch]
        prompts = [self.prompter.prompt(q.options, d, n)
                   for q, d, n in zip(batch, detected, audio_lengths, strict=True)]
        languages = [self.prompter.language(q.options, d) for q, d in zip(batch, detected, strict=True)]
        audio = (encoded.hidden, audio_lengths) if self.splices_audio else None
        last_logits, no_speech = self._run_prompts(prompts, slots, cross, audio)
        first, logprobs, tick = self._first_tokens(rows, batch, prompts, last_logits)
        host = torch.stack((first.double(), logprobs.double(), no_speech.double())).cpu().tolist()
        has_no_speech = [p.no_speech_index is not None for p in prompts]
        results = {
            row.request_id: EncodeResult(token_ids=() if q.is_beam else (int(token),), language=lang,
                                         logprobs=() if q.is_beam else (lp,), no_speech_prob=ns if has else None)
            for row, q, lang, token, lp, ns, has in zip(rows, batch, languages, *host, has_no_speech, strict=True)
        }
        return results, self.beams.collect(tick, 1) if tick is not None else {}

    def _features(self, batch: list[Request]) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, n_mels, frames] on the device, frame counts [B] on the host): the caller's features where a
        request brings them (a full window each), the extractor's elsewhere."""
        missing = [i for i, q in enumerate(batch) if q.features is None]
        audio = [self.stager.take(batch[i]) if self.stager else batch[i].audio for i in missing]
        lengths = self.features.frame_lengths(torch.tensor([len(q.audio) for q in batch]))
        computed = self.features.padded(audio, device=self.device) if missing else None
        if len(missing) == len(batch):
            return computed, lengths
        features = [q.features for q in batch]
        for j, i in enumerate(missing):
            features[i] = computed[j]
        return torch.stack([f.to(device=self.device, dtype=torch.float32) for f in features]), lengths

    def _detect(self, batch: list[Request], slots: torch.Tensor, cross: CrossAttentionCache) -> list[str | None]:
        """What each row's pre-pass finds (None for rows without one): every row needing one of the same tokens
        reads them in one decoder pass from position 0, which the prompt pass then rewrites."""
        detections = [self.prompter.detection(q.options) for q in batch]
        found: list[str | None] = [None] * len(batch)
        wanted = [i for i, d in enumerate(detections) if d is not None]
        if not wanted:
            return found
        by_tokens: dict[tuple, list[int]] = {}
        for i in wanted:
            by_tokens.setdefault((detections[i].token_ids, detections[i].candidates), []).append(i)
        for (token_ids, candidates), members in by_tokens.items():
            tokens, choices = upload(self.device, token_ids, candidates)
            tokens = tokens.expand(len(batch), -1)
            positions = torch.arange(len(token_ids), device=self.device).expand(len(batch), -1)
            table = self.state.block_table[slots, : -(-len(token_ids) // self.pool.block_size)]
            context = paged_context(self.pool, table, positions, from_start=True)
            hidden = self.model.decode_hidden(tokens, positions, context, cross)
            logits = self.model.logits(hidden[members, -1])
            best = logits[:, choices].argmax(dim=-1).tolist()  # the prompts depend on it: read at once
            for i, choice in zip(members, best, strict=True):
                found[i] = detections[i].names[choice]
        return found

    def _run_prompts(self, prompts: list[Prompt], slots: torch.Tensor, cross: CrossAttentionCache | None,
                     audio: tuple[torch.Tensor, list[int]] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs every row's prompt from position 0 into its cache; ``audio``: the encoder's output [B, S, d] and
        each row's audio positions, for a model that splices them into its prompt. -> (logits after each row's
        last prompt token [B, vocab], probability of the no-speech token at each row's ``no_speech_index`` [B], 0
        where there is none).

        Prompts that carry audio are as long as it is: they run in groups of similar length (``length_groups``),
        each right-padded to its own longest, so that a batch does not pay for its longest prompt in every row.
        Cross-attention prompts are a few tokens, nearly equal: they run as one group."""
        lengths = [len(p.token_ids) for p in prompts]
        groups = [list(range(len(prompts)))] if audio is None else length_groups(lengths)
        if len(groups) == 1:  # one group runs the rows in their own order (length_groups sorts them)
            groups = [list(range(len(prompts)))]
        picked = torch.cat([self._prompt_group(members, prompts, slots, cross, audio, whole=len(groups) == 1)
                            for members in groups])  # [B, 2, d] in group order
        if len(groups) > 1:
            order = [i for members in groups for i in members]
            (inverse,) = upload(self.device, sorted(range(len(order)), key=order.__getitem__))
            picked = picked[inverse]
        logits = self.model.logits(picked)
        if self.prompter.no_speech_token is None:
            return logits[:, 0], torch.zeros(len(prompts), device=self.device)
        return logits[:, 0], torch.softmax(logits[:, 1], dim=-1)[:, self.prompter.no_speech_token]

    def _prompt_group(self, members: list[int], prompts: list[Prompt], slots: torch.Tensor,
                      cross: CrossAttentionCache | None, audio: tuple[torch.Tensor, list[int]] | None, *,
                      whole: bool) -> torch.Tensor:
        """The prompts of rows ``members`` (all rows, in order, when ``whole``), right-padded to their longest, run
        into their slots' caches -> the hidden states [G, 2, d] after each one's last token and at its
        ``no_speech_index``."""
        group = [prompts[i] for i in members]
        lengths = [len(p.token_ids) for p in group]
        longest = max(lengths)
        tokens = torch.full((len(group), longest), self.prompter.end_token, dtype=torch.long)
        for i, p in enumerate(group):
            tokens[i, : lengths[i]] = torch.tensor(p.token_ids)
        tokens = upload_tensor(tokens, self.device)
        index = None if whole else upload(self.device, members)[0]
        positions = torch.arange(longest, device=self.device).expand(len(group), -1)
        table = self.state.block_table[slots if index is None else slots[index], : -(-longest // self.pool.block_size)]
        context = paged_context(self.pool, table, positions, from_start=True)
        if audio is None:
            hidden = self.model.decode_hidden(tokens, positions, context, cross)
        else:
            encoded, audio_lengths = audio
            encoded = encoded if index is None else encoded[index]
            embeds = self._spliced(tokens, group, encoded, [audio_lengths[i] for i in members])
            hidden = self.model.decode_embedded(embeds, positions, context)
        rows = torch.arange(len(group), device=self.device)
        last, at = upload(self.device, [n - 1 for n in lengths], [p.no_speech_index or 0 for p in group])
        return torch.stack((hidden[rows, last], hidden[rows, at]), dim=1)

    def _spliced(self, tokens: torch.Tensor, prompts: list[Prompt], encoded: torch.Tensor, lengths: list[int]
                 ) -> torch.Tensor:
        """The prompts' embeddings [B, T, d], each row's first ``lengths[i]`` encoder positions (``encoded``:
        [B, S, d]) in place of its audio positions. The indices are built on the host from known lengths."""
        rows, targets, sources = [], [], []
        for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
            if prompt.audio_index is None:
                raise ValueError("a model that splices its audio into the prompt gave a prompt without audio_index")
            rows += [i] * n
            targets += range(prompt.audio_index, prompt.audio_index + n)
            sources += range(n)
        row, target, source = upload(self.device, rows, targets, sources)
        embeds = self.model.embed(tokens)
        embeds[row, target] = encoded[row, source].to(embeds.dtype)
        return embeds

    def _first_tokens(self, rows: tuple[EncodeRow, ...], batch: list[Request], prompts: list[Prompt],
                      logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, BeamTick | None]:
        """Chooses each row's first token from the logits after its prompt and sets up its slots for decoding;
        starts the beam searches among them. -> (tokens [B], their log-probabilities [B], the searches)."""
        device = self.device
        options = [q.options for q in batch]
        prompt_lens, min_new, timestamps, owner, slots = upload(
            device, [len(p.token_ids) for p in prompts], [o.min_new_tokens for o in options],
            [o.timestamps for o in options], [i for i, row in enumerate(rows) for _ in row.slots],
            [slot for row in rows for slot in row.slots])
        (temperature,) = upload(device, [o.temperature for o in options], dtype=torch.float32)
        eot_from = prompt_lens - 1 + min_new
        timestamps = timestamps.bool()
        nothing = torch.zeros(len(rows), dtype=torch.long, device=device)  # no history: nothing sampled yet
        state = AEDRowState(
            eot_allowed=eot_from <= prompt_lens - 1,
            temperature=temperature,
            timestamps=TimestampState(timestamps, nothing, nothing, nothing)
            if any(o.timestamps for o in options) else None,
        )
        filtered = self.strategy.filter(logits, state, first=True)
        first, logprobs = self.strategy.choose(filtered, state, sampling=any(o.temperature > 0 for o in options))
        # Every slot of a row starts from the row's prompt; beam rows then take their search's first tokens.
        self.state.start(slots, owner, first, prompt_lens, eot_from, timestamps, temperature)
        return first, logprobs, self._start_beams(rows, batch, prompts, filtered)

    def _start_beams(self, rows: tuple[EncodeRow, ...], batch: list[Request], prompts: list[Prompt],
                     filtered: torch.Tensor) -> BeamTick | None:
        """The first step of every beam search among ``rows``: K beams out of the prompt's filtered logits
        ([B, vocab]); the prompt's K/V, in each request's first slot, is copied to its other slots."""
        searching = {row.request_id: i for i, (row, q) in enumerate(zip(rows, batch, strict=True)) if q.is_beam}
        if not searching:
            return None
        vocab = filtered.shape[-1]
        groups = [self.beams.open(rows[i].request_id, rows[i].slots, len(prompts[i].token_ids),
                                  batch[i].max_new_tokens, batch[i].options,
                                  self.contexts.get(batch[i].options.hotwords, vocab, self.device)
                                  if batch[i].options.hotwords else None)
                  for i in searching.values()]
        tick = self.beams.tick(groups, max(len(rows[i].block_ids[0]) for i in searching.values()))
        order, prompt_lens = upload(self.device, [searching[g.request_id] for g in tick.groups],
                                    [g.prompt_len for g in tick.groups])
        sources, targets, tokens = self.beams.first_step(tick, torch.log_softmax(filtered[order], dim=-1), prompt_lens)
        self.state.set_first_beams(targets, tokens)
        table = self.state.block_table
        self.pool.copy_blocks(table[sources, : tick.num_blocks], table[targets, : tick.num_blocks])
        return tick
