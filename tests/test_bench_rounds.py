"""The model benches' rounds: warm-up of every peer batch size, alternating timed rounds, the best of each side and
the agreement of their tokens, on made-up runs."""

from __future__ import annotations

from oasr.bench.rounds import alternate, report


def test_rounds_keep_the_best_of_each_side_and_compare_the_best_peers_tokens() -> None:
    calls: list[object] = []
    our_times = iter([2.0, 1.5])
    peer_times = {8: iter([9.0, 4.0, 5.0]), 16: iter([9.0, 3.0, 3.5])}  # the first of each is the warm-up

    def ours():
        calls.append("oasr")
        return next(our_times), {"r0": [1, 2], "r1": [3], "r2": [4]}

    def peer(batch_size: int):
        calls.append(batch_size)
        return next(peer_times[batch_size]), [[1, 2], [3] if batch_size == 16 else [0], [5]]

    rounds = alternate(ours, peer, [8, 16], 2)
    assert calls == [8, 16, "oasr", 8, 16, "oasr", 8, 16]
    assert rounds.best_batch_size == 16 and rounds.best_peer_seconds == 3.0
    out = report({"arch": "x"}, rounds, audio_seconds=30.0)
    assert out["arch"] == "x" and out["oasr"]["seconds"] == 1.5 and out["oasr"]["audio_seconds_per_second"] == 20.0
    assert out["transformers"]["batch_size"] == 16 and out["transformers"]["rounds"] == {8: [4.0, 5.0], 16: [3.0, 3.5]}
    assert out["speedup"] == 2.0
    assert out["identical_outputs"] == 2 / 3  # r0 and r1 agree with the batch-16 peer, r2 does not
