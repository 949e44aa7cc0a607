"""The object study: how much of each map falls on each game object, against RAM ground truth,
as a script (run.py) and as sweep configs (sweep/). README.md describes it."""
