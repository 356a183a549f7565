"""Resolving a name against a catalog, with the closest matches on a miss."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from solver.errors import InputError


def unknown_name_error(kind: str, name: str, known: Iterable[str], hint: str) -> InputError:
    """`unknown model 'lama3-8b'; closest: llama3-8b, ...` plus how to list them all."""
    known = sorted(known)
    close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.5)
    if not close:
        close = [k for k in known if name.lower() in k][:3]
    suggestion = f"; closest: {', '.join(close)}" if close else ""
    return InputError(f"unknown {kind} '{name}'{suggestion} ({hint})")
