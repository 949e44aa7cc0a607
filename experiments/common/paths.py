"""Where the experiments keep their results: experiments/results/<study>/ (the studies' code lives
in experiments/<study>/, their data stays here)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the repository's root
RESULTS = ROOT / "experiments" / "results"
