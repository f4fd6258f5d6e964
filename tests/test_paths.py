"""Socket directory: the lookup order and the trust checks, as the daemon and clients apply them.

Run: pytest tests/test_paths.py
"""

from __future__ import annotations

import os

import pytest

from conftest import run_cli


@pytest.mark.parametrize("mode, message", [(0o777, "group/world accessible (mode 0777)"), ("link", "is a symlink")])
def test_untrusted_socket_dir_is_refused(socket_dir, mode, message):
    target = socket_dir / "d"
    if mode == "link":
        (socket_dir / "real").mkdir(mode=0o700)
        target.symlink_to(socket_dir / "real")
    else:
        target.mkdir()
        os.chmod(target, mode)
    result = run_cli("daemon", "--socket-dir", str(target))
    assert result.returncode == 1 and message in result.stderr
