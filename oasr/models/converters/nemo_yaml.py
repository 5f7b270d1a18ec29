"""A NeMo ``model_config.yaml`` as the converters read it: ``${a.b}`` references resolved, dotted-path lookups, and
refusals that name the field (shared by the NeMo config mapper and the Canary mapping it calls)."""

from __future__ import annotations

import re
from typing import Any

from oasr.errors import CheckpointError

_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")


class NemoYaml:
    """A NeMo config (a nested dict) with ``${a.b}`` references resolved and dotted-path lookups that name the
    field in every refusal."""

    def __init__(self, values: dict[str, Any], source: str) -> None:
        self.values = values
        self.source = source

    def get(self, path: str, default: Any = None) -> Any:
        node: Any = self.values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        if isinstance(node, str) and (match := _INTERPOLATION.match(node)):
            return self.get(match.group(1), default)
        return default if node is None else node

    def require(self, path: str) -> Any:
        value = self.get(path)
        if value is None:
            raise CheckpointError(f"{self.source}: model_config.yaml has no {path}")
        return value

    def refuse(self, path: str, value: Any, served: str) -> CheckpointError:
        return CheckpointError(f"{self.source}: model_config.yaml {path}={value!r} is not supported (OASR serves "
                               f"{served})")

    def expect(self, path: str, allowed: tuple[Any, ...], default: Any = None) -> Any:
        value = self.get(path, default)
        if value not in allowed:
            raise self.refuse(path, value, " or ".join(repr(a) for a in allowed))
        return value
