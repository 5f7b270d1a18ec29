"""The AED runner's beam searches: their state on the device, and the host bookkeeping that ends them.

Every beam of a request is a decode row (a slot with its own block table), so one model step serves beam rows
and greedy rows alike. After the step, ``BeamRows.advance`` picks every search's next beams in one batched
selection per beam size (``AEDBeam.select``); a row whose new beam extends another row's beam takes over that
row's state: its generated tokens (``history``), its summed log-probability, and (in the runner) its
timestamp-rule state and self-attention K/V. Cross-attention K/V is the same for all beams of a request and is
copied into each of its slots at encode.

What the host needs is staged on the device per step and read once per tick: the scores and tokens of the
hypotheses that ended at each step, and each step's live beams (a search that ends with fewer than
``beam_size`` ended hypotheses ranks the live beams of the step it ended at). A first read brings the ended
scores only; the host then decides which hypotheses the searches take and which searches end, and a second read
brings just those tokens.

Hotwords (a request's ``ContextGraph``) steer its search: each beam row also holds a state of the phrase automaton,
and a step adds the gain of every next token from that state to its log-probability before the selection, so
beams rank by summed log-probability plus the boost they hold. Searches are grouped by beam size and automaton.
The staged scores carry the boost; on the host a search's hypotheses are ranked by score less any match still
open (a hypothesis keeps only whole phrases' boost), and the result reports its summed log-probability alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from oasr.decode.aed_beam import AEDBeam, BeamCandidates, BeamChoice, Hypothesis
from oasr.decode.hotwords import ContextGraph
from oasr.engine.step import BeamResult
from oasr.uploads import upload
from oasr.types import DecodeOptions


@dataclass
class BeamGroup:
    """One request's search, on the host."""

    request_id: str
    slots: tuple[int, ...]  # its rows, in beam order
    prompt_len: int  # the first generated token sits at this position
    max_new_tokens: int
    search: BeamCandidates
    context: ContextGraph | None = None  # the request's hotwords
    num_generated: int = 0  # tokens per live beam so far


@dataclass(frozen=True)
class BeamTick:
    """The searches of one walk, grouped by beam size and hotwords; ``slots`` [G, K] int64 on the device, one row
    per search."""

    by_size: tuple[tuple[int, ContextGraph | None, tuple[BeamGroup, ...], torch.Tensor], ...]
    num_blocks: int  # block-table columns that hold the beam rows' positions (for K/V copies)

    @property
    def groups(self) -> Iterable[BeamGroup]:
        for _, _, groups, _ in self.by_size:
            yield from groups


class BeamRows:
    """``strategy``: the architecture's beam step (None: it has none, and no search is ever opened)."""

    def __init__(self, strategy: AEDBeam | None, num_slots: int, max_positions: int, max_steps: int,
                 device: torch.device) -> None:
        self.strategy = strategy
        self.device = device
        length = max_positions + 1  # a step writes the token after position max_positions - 1
        long = {"dtype": torch.long, "device": device}
        self.history = torch.zeros(num_slots, length, **long)  # each row's tokens by position
        self.scores = torch.zeros(num_slots, dtype=torch.float32, device=device)
        self.context_state = torch.zeros(num_slots, **long)  # each row's state in its search's hotword automaton
        self.ended_scores = torch.full((max_steps, num_slots), float("nan"), device=device)
        self.ended_tokens = torch.zeros(max_steps, num_slots, length, **long)
        self.live_scores = torch.zeros(max_steps, num_slots, device=device)
        self.live_tokens = torch.zeros(max_steps, num_slots, length, **long)
        self.groups: dict[str, BeamGroup] = {}

    # ------------------------------------------------------------------ host bookkeeping

    def open(self, request_id: str, slots: Sequence[int], prompt_len: int, max_new_tokens: int,
             options: DecodeOptions, context: ContextGraph | None = None) -> BeamGroup:
        """``context``: the automaton of the request's hotwords, on this device."""
        group = BeamGroup(request_id, tuple(slots), prompt_len, max_new_tokens, self.strategy.candidates_for(options),
                          context)
        self.groups[request_id] = group
        return group

    def release(self, slots: Iterable[int]) -> None:
        """Forgets the searches holding any of ``slots`` (finished, aborted or preempted requests)."""
        freed = set(slots)
        for request_id in [r for r, g in self.groups.items() if freed.intersection(g.slots)]:
            del self.groups[request_id]

    def tick(self, groups: Sequence[BeamGroup], num_blocks: int) -> BeamTick | None:
        if not groups:
            return None
        by_kind: dict[tuple[int, int], tuple[ContextGraph | None, list[BeamGroup]]] = {}
        for group in groups:
            by_kind.setdefault((len(group.slots), id(group.context)), (group.context, []))[1].append(group)
        return BeamTick(
            tuple((k, context, tuple(gs), upload(self.device, [g.slots for g in gs])[0].view(len(gs), k))
                  for (k, _), (context, gs) in sorted(by_kind.items(), key=lambda item: item[0][0])),
            num_blocks,
        )

    # ------------------------------------------------------------------ device steps

    def first_step(self, tick: BeamTick, logprobs: torch.Tensor, prompt_lens: torch.Tensor,
                   step: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Starts every search of ``tick`` from its prompt, which is in the group's first slot.
        logprobs: [G_total, vocab] after each group's prompt, in ``tick.groups`` order; prompt_lens: [G_total].
        -> (source slots [N], target slots [N], tokens [N]) over all beam rows, for the caller's state copies."""
        sources, targets, tokens, start = [], [], [], 0
        for k, context, groups, slots in tick.by_size:
            end = start + len(groups)
            scores = torch.zeros(len(groups), 1, device=self.device)
            first = slots[:, :1]
            self.context_state[first] = 0  # every search starts at its automaton's root
            choice = self.strategy.select(self._biased(logprobs[start:end, None], first, context), scores, k)
            self._follow(context, slots, first.expand(-1, k), choice)
            self._stage_ended(step, slots, first.expand(-1, choice.ended_source.shape[1]), choice)
            source = first.expand(-1, k)
            self._extend(step, slots, source, choice, prompt_lens[start:end])
            sources.append(source.flatten())
            targets.append(slots.flatten())
            tokens.append(choice.tokens.flatten())
            start = end
        return torch.cat(sources), torch.cat(targets), torch.cat(tokens)

    def advance(self, tick: BeamTick, step: int, filtered: torch.Tensor, positions: torch.Tensor,
                next_tokens: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of every search in ``tick``. filtered: [B, vocab] filtered logits of all rows;
        positions: [B] where each row's last token was written. Writes each beam row's new token into
        ``next_tokens`` [B] and the slot it now continues into ``source`` [B] (identity for greedy rows).
        -> (source slots [N], target slots [N]) of the beam rows, for the K/V copy."""
        sources, targets = [], []
        for k, context, _, slots in tick.by_size:
            logprobs = self._biased(torch.log_softmax(filtered[slots], dim=-1), slots, context)
            choice = self.strategy.select(logprobs, self.scores[slots], k)
            beam_source = slots.gather(1, choice.source)
            self._follow(context, slots, beam_source, choice)
            self._stage_ended(step, slots, slots.gather(1, choice.ended_source), choice)
            self._extend(step, slots, beam_source, choice, positions[slots[:, 0]] + 1)
            next_tokens[slots] = choice.tokens
            source[slots] = beam_source
            sources.append(beam_source.flatten())
            targets.append(slots.flatten())
        return torch.cat(sources), torch.cat(targets)

    def _biased(self, logprobs: torch.Tensor, slots: torch.Tensor, context: ContextGraph | None) -> torch.Tensor:
        """logprobs [G, R, vocab] of the rows ``slots`` [G, R], plus each token's hotword gain from the row's
        automaton state (unchanged without hotwords)."""
        if context is None:
            return logprobs
        return logprobs + context.gain[self.context_state[slots]]

    def _follow(self, context: ContextGraph | None, slots: torch.Tensor, beam_source: torch.Tensor,
                choice: BeamChoice) -> None:
        """Each new beam's automaton state: its source row's, advanced by its token."""
        if context is not None:
            self.context_state[slots] = context.next_state[self.context_state[beam_source], choice.tokens]

    def _stage_ended(self, step: int, slots: torch.Tensor, ended_source: torch.Tensor, choice: BeamChoice) -> None:
        """Records the step's ended hypotheses in the first columns of each group's slots, best first: their
        scores, and their source beam's tokens (read before this step's reordering overwrites them)."""
        columns = slots[:, : ended_source.shape[1]].flatten()
        self.ended_scores[step].index_fill_(0, slots.flatten(), float("nan"))
        self.ended_scores[step].index_copy_(0, columns, choice.ended_scores.flatten())
        self.ended_tokens[step].index_copy_(0, columns, self.history.index_select(0, ended_source.flatten()))

    def _extend(self, step: int, slots: torch.Tensor, source: torch.Tensor, choice: BeamChoice,
                new_positions: torch.Tensor) -> None:
        """Each target row takes its source row's tokens plus its new token at ``new_positions`` [G]."""
        targets = slots.flatten()
        self.history.index_copy_(0, targets, self.history.index_select(0, source.flatten()))
        columns = new_positions.repeat_interleave(slots.shape[1])
        self.history[targets, columns] = choice.tokens.flatten()
        self.scores.index_copy_(0, targets, choice.scores.flatten())
        self.live_tokens[step].index_copy_(0, targets, self.history.index_select(0, targets))
        self.live_scores[step].index_copy_(0, targets, choice.scores.flatten())

    # ------------------------------------------------------------------ host read

    def collect(self, tick: BeamTick, num_steps: int) -> dict[str, BeamResult]:
        """After ``num_steps`` steps of ``tick``: feeds each search the hypotheses that ended, in step order, and
        returns the results of the searches that ended (quota of ended hypotheses reached, or token budget)."""
        groups = list(tick.groups)
        columns = [slot for g in groups for slot in g.slots]
        firsts = [g.slots[0] for g in groups]  # the best live beam of each search sits in its first slot
        staged = torch.cat((self.ended_scores[:num_steps, columns], self.live_scores[:num_steps, firsts]), dim=1)
        staged = staged.double().cpu().tolist()
        plans, wanted, offset = [], [], 0
        for index, group in enumerate(groups):
            ended = [[(slot, s) for slot, s in zip(group.slots, row[offset : offset + len(group.slots)], strict=True)
                      if not math.isnan(s)] for row in staged]
            best_live = [row[len(columns) + index] for row in staged]
            plan = group.search.plan(ended, best_live, group.num_generated, group.max_new_tokens)
            plans.append(plan)
            taken, final = plan
            wanted += [("ended", step, slot) for step, slot, _ in taken]
            if final is not None and group.search.wants_live(len(taken)):
                wanted += [("live", final, slot) for slot in group.slots]
            offset += len(group.slots)
        rows = self._fetch(wanted)
        results: dict[str, BeamResult] = {}
        for group, (taken, final) in zip(groups, plans, strict=True):
            results.update(self._settle(group, taken, final, num_steps, rows))
        return results

    def _fetch(self, wanted: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[list[int], float]]:
        """The staged rows named by (kind, step, slot), in one transfer: tokens by position and the score."""
        if not wanted:
            return {}
        steps, slots, is_live = upload(self.device, [step for _, step, _ in wanted], [slot for _, _, slot in wanted],
                                       [kind == "live" for kind, _, _ in wanted])
        is_live = is_live.bool()
        tokens = torch.where(is_live[:, None], self.live_tokens[steps, slots], self.ended_tokens[steps, slots])
        scores = torch.where(is_live, self.live_scores[steps, slots], self.ended_scores[steps, slots])
        host = torch.cat((tokens.double(), scores.double()[:, None]), dim=1).cpu().tolist()
        return {key: ([int(t) for t in row[:-1]], row[-1]) for key, row in zip(wanted, host, strict=True)}

    def _settle(self, group: BeamGroup, taken: list[tuple[int, int, float]], final: int | None, num_steps: int,
                rows: dict[tuple[str, int, int], tuple[list[int], float]]) -> dict[str, BeamResult]:
        start = group.prompt_len
        automaton = group.context.host if group.context is not None else None
        for step, slot, score in taken:
            tokens, _ = rows[("ended", step, slot)]
            # An ended hypothesis is its source beam's tokens before this step, then end-of-text (which closes
            # any open match: its score holds whole phrases' boost only).
            group.search.add([Hypothesis(tuple(tokens[start : start + group.num_generated + step]), score)])
        if final is None:
            group.num_generated += num_steps
            return {}
        length = group.num_generated + final + 1
        live = []
        for key in (("live", final, slot) for slot in group.slots):
            if key in rows:
                tokens = tuple(rows[key][0][start : start + length])
                # A live beam's score still holds its open match's boost: ranked without it, as an ended one.
                held = automaton.open_boost(tokens) if automaton else 0.0
                live.append(Hypothesis(tokens, rows[key][1] - held, ended=False))
        best = group.search.best(live)
        del self.groups[group.request_id]
        # Reported: the summed log-probability, without the boost it was ranked with.
        boost = automaton.kept_boost(best.token_ids) if automaton else 0.0
        return {group.request_id: BeamResult(best.token_ids, best.sum_logprob - boost, ended=best.ended)}
