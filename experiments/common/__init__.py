"""Helpers every study and benchmark shares: the results folder, the machine record, hashes."""
