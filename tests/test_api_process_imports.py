"""The server's API processes (process mode: the engine runs in a core process of its own) import no torch:
each HTTP worker costs its interpreter, its web stack and its audio decoders, not a second copy of torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_api_side_of_a_process_mode_server_imports_no_torch():
    code = ("import sys, oasr.serving.app, oasr.serving.workers, oasr.hosting.mp, oasr.transcription.spans, "
            "oasr.hosting.ray_replicas; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"torch modules imported: {out.stdout.strip()}"


def test_building_the_cli_parser_imports_no_torch() -> None:
    """Every command builds every parser (``oasr serve`` too): the server's HTTP process stays torch-free."""
    import subprocess
    import sys

    code = "import sys, oasr.cli; oasr.cli.build_parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
