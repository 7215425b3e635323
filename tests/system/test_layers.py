"""The import contracts of pyproject.toml ([tool.importlinter]) hold: imports point down the layers
(cli > api > ops | reports > core > store | broker), core imports no transport library, store and
broker import no HTTP, only the store imports redis and only the Kafka adapter confluent_kafka.
`make lint` checks the same; here it is part of `make test` too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..support import ROOT


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), "lint-imports missing: the dev extra installs import-linter"
    p = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-2000:]
