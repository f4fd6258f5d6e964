"""CLI: bad input is one line on stderr, no traceback, a non-zero exit.

Run: pytest tests/test_cli.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]  # the clone: hotweights is installed from it (editable)


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


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_a_model_path_that_does_not_exist_is_one_line_at_once(tmp_path, command):
    missing = str(tmp_path / "demo" / "modle")
    args = [missing] if command == "serve" else ["--model", missing]
    r = run_cli(command, *args, timeout=30)
    assert one_line_error(r, 1) == (f"hotweights {command}: model directory {missing} does not exist; models are "
                                    f"local directories (download the model first)")


def busy_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def test_serve_on_a_busy_port_fails_before_loading_the_model(models):
    with busy_port() as s:
        port = s.getsockname()[1]
        r = run_cli("serve", str(models["tiny"]), "--port", str(port), timeout=60)
    line = one_line_error(r, 2)
    assert line.startswith(f"hotweights serve: cannot listen on 127.0.0.1:{port} (Address already in use)")
    assert "startup:" not in r.stderr and "Mapped" not in r.stderr  # nothing was loaded


@pytest.mark.slow  # 6-9 s: the fast tier stays under 3 min
def test_verify_never_polls_a_server_it_did_not_start(models, tmp_path):
    with busy_port() as s:
        port = s.getsockname()[1]
        r = run_cli("verify", "--model", str(models["tiny"]), "--port", str(port), "--out", str(tmp_path / "v"),
                    timeout=120)
    assert one_line_error(r, 2).startswith(f"hotweights verify: port {port} is busy")
    assert not (tmp_path / "v" / "disk.json").exists()


def test_a_missing_extra_is_one_line_naming_it(models):
    import subprocess
    import sys

    code = ("import sys; sys.modules['starlette'] = None; from hotweights.cli import main; "
            f"sys.exit(main(['serve', {str(models['tiny'])!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert one_line_error(r, 1) == f"hotweights serve: starlette is not installed; pip install '{ROOT}[serve]'"
    # without torch, serve names its whole extra at once (it brings torch too), not [engine] and then [serve]
    r = subprocess.run([sys.executable, "-c", code.replace("'starlette'", "'torch'")], capture_output=True, text=True,
                       timeout=60)
    assert one_line_error(r, 1) == f"hotweights serve: torch is not installed; pip install '{ROOT}[serve]'"


def test_verify_says_what_it_lacks_before_it_starts_anything(models, tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['starlette'] = None; from hotweights.cli import main; "
            f"sys.exit(main(['verify', '--model', {str(models['tiny'])!r}, '--out', {str(tmp_path / 'v')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert one_line_error(r, 1) == ("hotweights verify: --engine hotweights needs starlette, not installed here; "
                                    f"pip install '{ROOT}[serve]'")  # not on PyPI: this clone
    r = run_cli("verify", "--engine", "vllm", "--model", str(models["tiny"]), "--out", str(tmp_path / "v"),
                env={"HOTWEIGHTS_VLLM_PYTHON": str(tmp_path / "no-python")})
    assert "runs vLLM with" in one_line_error(r, 1) and "HOTWEIGHTS_VLLM_PYTHON" in r.stderr
    assert not (tmp_path / "v").exists()  # nothing ran


def test_the_budget_takes_units_and_status_shows_it(socket_dir):
    import json

    from conftest import DaemonProc

    d = DaemonProc(socket_dir, "--max-bytes", "1G")
    try:
        data = json.loads(run_cli("status", "--json", "--socket-dir", str(socket_dir)).stdout)
        assert data["max_bytes"] == 1 << 30
        assert "budget: 0.00 of 1.00 GiB (--max-bytes)" in run_cli("status", "--socket-dir", str(socket_dir)).stdout
    finally:
        d.stop()
    bad = run_cli("daemon", "--max-bytes", "lots", "--socket-dir", str(socket_dir))
    assert bad.returncode == 2 and "'lots' is not a size" in bad.stderr


def test_status_without_a_daemon_says_how_to_start_one_and_json_stays_json(socket_dir, tmp_path):
    import json

    r = run_cli("status", "--socket-dir", str(socket_dir))
    assert "`hotweights preload --model DIR` starts one" in one_line_error(r, 1)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # another user could plant a socket here: not trusted
    r = run_cli("status", "--json", "--socket-dir", str(shared))
    assert r.returncode == 1 and json.loads(r.stdout)["running"] is False


@pytest.mark.slow  # 6-9 s: the fast tier stays under 3 min
def test_preloads_checks_are_not_counted_as_attaches(models, daemon):
    import json

    sock = str(daemon.paths.directory)
    for _ in range(2):  # the second finds it cached
        assert run_cli("preload", "--model", str(models["tiny"]), "--socket-dir", sock).returncode == 0
    entries = json.loads(run_cli("status", "--json", "--socket-dir", sock).stdout)["entries"]
    assert [e["num_attaches"] for e in entries] == [0]


def test_status_json_without_a_daemon_is_json(socket_dir):
    import json

    r = run_cli("status", "--json", "--socket-dir", str(socket_dir))
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["running"] is False and "no daemon socket at" in data["reason"]


def test_the_model_is_given_either_way(models):
    by_position = run_cli("inspect", str(models["tiny"]), "--json")
    by_option = run_cli("inspect", "--model", str(models["tiny"]), "--json")
    assert by_position.returncode == by_option.returncode == 0 and by_position.stdout == by_option.stdout
    both = run_cli("inspect", str(models["tiny"]), "--model", "/elsewhere")
    assert both.returncode == 2 and "give the model directory once" in both.stderr


def test_serve_help_shows_help_texts_and_defaults():
    r = run_cli("serve", "--help")
    assert r.returncode == 0 and "port to listen on" in r.stdout and "(default: 8000)" in r.stdout


@pytest.mark.slow  # 6-9 s: the fast tier stays under 3 min
def test_status_warns_when_a_model_is_cached_twice(models, daemon):
    sock = str(daemon.paths.directory)
    for dtype in ("float16", "bfloat16"):
        assert run_cli("preload", str(models["tiny"]), "--dtype", dtype, "--socket-dir", sock).returncode == 0
    r = run_cli("status", "--socket-dir", sock)
    assert r.returncode == 0 and "note: tiny is cached 2 times (float16 checkpoint on cpu, bfloat16 checkpoint on " \
                                 "cpu)" in r.stdout, r.stdout


def test_the_vllm_launcher_fails_a_strict_start_before_vllm_is_imported(models, socket_dir, daemon, tmp_path):
    """``hotweights vllm serve ...``: no daemon, or a daemon without the model, is the strict message
    in well under vLLM's import time; this venv has no vLLM at all, so nothing of it ran."""
    import json
    import time

    def launch(model, sock) -> tuple[int, str, float]:
        start = time.monotonic()
        r = run_cli("vllm", "serve", str(model), "--load-format", "hotweights", "--model-loader-extra-config",
                    json.dumps({"socket_dir": str(sock), "fallback": False}))
        return r.returncode, r.stderr, time.monotonic() - start

    none = tmp_path / "none"
    code, err, seconds = launch(models["tiny"], none)
    assert code == 1 and f"Weight cache unusable (daemon unavailable: no daemon socket at {none}/daemon.sock) " \
                          f"and fallback is disabled" in err
    assert seconds < 10, seconds
    code, err, _ = launch(models["tiny"], daemon.paths.directory)  # the daemon holds nothing
    assert code == 1 and "Weight cache unusable (cache miss for tiny: the daemon holds no entry of this model" in err
    # not strict: the launcher hands over to vLLM, which this venv lacks: one line saying so
    r = run_cli("vllm", "--model", str(models["tiny"]), "--load-format", "hotweights")
    assert r.returncode == 2 and "hotweights vllm: vLLM is not installed for" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["preload", "serve", "daemon", "verify"])
def test_help_states_each_default_once(command):
    import re

    text = run_cli(command, "--help").stdout
    blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    twice = [b.split()[0] for b in blocks if b.count("(default") > 1 or "(None" in b or "(default: None)" in b]
    assert not twice, f"{command} --help states a default twice for {twice}"


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"]])
def test_hotweights_vllm_help_is_its_own_and_points_to_vllms(args):
    """No vLLM needed: what hotweights adds (the strict check, the standby, --park-on-exit), then where vLLM's is."""
    done = run_cli("vllm", *args)
    assert done.returncode == 0, done.stderr
    assert "--park-on-exit [1|2]" in done.stdout and "vLLM's own options: hotweights vllm serve --help" in done.stdout


def test_hotweights_vllm_preload_answers_with_the_hotweights_command_that_does_it():
    """``vllm preload`` is vLLM 0.32's own cache (GPU only): no vLLM is run, the equivalent is said, exit 2."""
    done = run_cli("vllm", "preload", "--model", "/m/Qwen3-8B", "-tp", "2", "--max-model-len", "512",
                   "--enforce-eager", "--weight-cache-socket-dir", "/tmp/x")
    assert done.returncode == 2 and done.stdout == ""
    assert ("hotweights preload --engine vllm --model /m/Qwen3-8B --tensor-parallel-size 2 "
            "--vllm-arg=--max-model-len=512 --vllm-arg=--enforce-eager\n") in done.stderr
    assert "hotweights vllm serve /m/Qwen3-8B --tensor-parallel-size 2 --load-format hotweights" in done.stderr


def test_preload_refuses_a_directory_without_config_json_in_one_line(model_copy, tmp_path):
    """Before: its weights were published under a model that no engine can serve."""
    model = model_copy("tiny")
    (model / "config.json").unlink()
    r = run_cli("preload", "--model", str(model), "--socket-dir", str(tmp_path / "sock"))
    assert one_line_error(r, 1) == (f"hotweights preload: no config.json in {model}; a model directory holds it "
                                    f"beside its weight files")
    assert not (tmp_path / "sock" / "daemon.sock").exists()  # refused before any keeper started


def test_serve_on_a_truncated_safetensors_file_says_so_in_one_line(model_copy, tmp_path):
    """Before: a 28-line safetensors traceback (the preload said it in one line)."""
    model = model_copy("tiny")
    shard = next(model.glob("*.safetensors"))
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1000)
    r = run_cli("serve", str(model), "--port", "9", env={"HOTWEIGHTS_SOCKET_DIR": str(tmp_path / "none")})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]  # after the cache's fallback warning
    assert last.startswith(f"hotweights serve: {shard} cannot be read (") and last.endswith(
        "): the file is damaged or truncated; download it again"), r.stderr


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("vllm") is not None,
                    reason="needs an interpreter without vLLM (the project's .venv has none)")
def test_a_vllm_preload_run_again_keeps_the_last_runs_log(models, tmp_path):
    """Issue 55: a preload that failed beside others ran again alone and its log took the first one's place, so the
    first failure's reason was lost. Here vLLM cannot even start (an interpreter without it), twice."""
    import sys

    sock = tmp_path / "sock"
    try:
        for _ in range(2):
            r = run_cli("preload", "--engine", "vllm", "--model", str(models["tiny"]), "--socket-dir", str(sock),
                        "--vllm-python", sys.executable, env={"HOTWEIGHTS_VLLM_STANDBY": "off"}, timeout=120)
            assert r.returncode == 1 and "No module named 'vllm'" in r.stderr, r.stderr
        log = sock / f"vllm-preload-{models['tiny'].name}.log"
        kept = log.with_name(log.name + ".1")
        assert "No module named 'vllm'" in log.read_text() and "No module named 'vllm'" in kept.read_text()
    finally:
        run_cli("stop", "--socket-dir", str(sock))
