"""CLI: bad input is one line on stderr, no traceback, a non-zero exit.

Run: pytest tests/test_cli.py
"""

from __future__ import annotations

import pytest

from conftest import run_cli


def one_line_error(result, code: int) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    return result.stderr.strip()


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_malformed_extra_config_names_the_option(models, command):
    model = ["--model", str(models["tiny"])] if command == "generate" else [str(models["tiny"])]
    r = run_cli(command, *model, "--model-loader-extra-config", "{fallback: false}")
    line = one_line_error(r, 2)
    assert line.startswith(f"hotweights {command}: --model-loader-extra-config is not valid JSON")
    assert "'{fallback: false}'" in line


@pytest.mark.parametrize("socket_dir, reason", [("/sys/hw", "Operation not permitted"),
                                                 ("/etc/passwd/hw", "Not a directory")])
def test_unusable_socket_dir_is_one_line(models, socket_dir, reason):
    r = run_cli("preload", "--model", str(models["tiny"]), "--socket-dir", socket_dir)
    assert one_line_error(r, 1) == f"hotweights preload: cannot use {socket_dir}: {reason}"
