"""Checkpoint converters, one module per on-disk format, registered in ``oasr.models.CONVERTERS``."""
