"""FunASR's CT-Transformer punctuation model (``model: CTTransformer``, as the ``ct-punc`` folders ship it): read from
its folder and run as a ``Punctuator`` (``oasr.models.punctuation``) over transcripts of models that write no
punctuation. A model package, since it reads checkpoints; nothing outside ``oasr/models/`` imports it."""
