"""Paper B (Huber et al. 2022): sanity checks and insertion fidelity on four Atari games, its
re-analysis, and the pre-registered re-run over independent episodes. README.md describes them."""
