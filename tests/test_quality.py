"""Repository checks that belong to the test command: generated code is current, and our own
packages are lint-clean and type-clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_generated_protobuf_code_is_current() -> None:
    result = _run(sys.executable, "scripts/gen_protos.py", "--check")
    assert result.returncode == 0, result.stderr + result.stdout


def test_ruff_lint_and_format() -> None:
    ruff = str(Path(sys.executable).parent / "ruff")  # a dev dependency, beside this Python
    lint = _run(ruff, "check", ".")
    assert lint.returncode == 0, lint.stdout
    fmt = _run(ruff, "format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout


def test_mypy_strict_on_our_packages() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout


def test_import_layers_hold() -> None:
    """pyproject's import-linter contracts: the layers, no service importing another's package,
    the SDK free of the services, no cycles between sibling modules."""
    lint_imports = str(Path(sys.executable).parent / "lint-imports")
    result = _run(lint_imports, "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
