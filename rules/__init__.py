"""Vigil checkers, importable without the daemon."""
