"""Runtime checks in app/ raise errors that `python -O` keeps (app/errors.py: required)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import InternalError, required

ROOT = Path(__file__).resolve().parents[2]


def test_required_returns_the_value_and_names_what_is_missing() -> None:
    assert required(0, "a count") == 0
    assert required("", "a text") == ""
    with pytest.raises(InternalError, match="internal error: the record key is missing"):
        required(None, "the record key")


def test_the_check_survives_python_dash_o() -> None:
    code = "from app.errors import required\ntry:\n    required(None, 'x')\nexcept RuntimeError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-O", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "internal error: x is missing"
