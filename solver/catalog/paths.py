"""Where the zoo and the cluster catalog live: inside the installed wheel
(`solver/_data/...`, see pyproject's force-include) or, in a source checkout, at the top of
the repository."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def data_dir(kind: str) -> Path:
    """Folder holding `kind` ("models" or "clusters")."""
    packaged = _PACKAGE_DIR / "_data" / kind
    if packaged.is_dir():
        return packaged
    checkout = _PACKAGE_DIR.parent / kind
    if checkout.is_dir():
        return checkout
    raise AssertionError(f"parplan is installed without its {kind}/ folder ({packaged})")
