"""Helpers shared by the tests (models, reference writers, file builders); no tests here.

ROOT is the checkout, DATA the committed test data (tests/data)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
