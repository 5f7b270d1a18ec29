"""Speaker diarization: who speaks when, from a diarization checkpoint (``oasr.models.DIARIZATION_ARCHITECTURES``).

``loader`` loads one; ``offline`` diarizes whole inputs in batches; ``segments`` turns frame probabilities into
speaker segments; ``rttm`` writes them as scorers read them; ``stream`` carries live streams' speaker caches.
"""
