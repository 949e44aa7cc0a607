"""Where the experiments keep their results: experiments/results/<study>/ (the studies' code lives
in experiments/<study>/, their data stays here)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the repository's root
RESULTS = ROOT / "experiments" / "results"


def write_results(out: Path, res: dict, text: str, json_name: str, md_name: str) -> None:
    """A run's results into `out`: the record as indented JSON (json_name) and its report (md_name)."""
    import json
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / json_name).write_text(json.dumps(res, indent=1) + "\n")
    (out / md_name).write_text(text)
