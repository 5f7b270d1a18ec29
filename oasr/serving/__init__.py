"""Serving front ends and the output formats they share with the CLI."""
