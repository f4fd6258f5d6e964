"""Issue 53, an operator's front (first part): the engine flags the front sets itself refused in one line that
names the config key to use, ``aliases`` routed and listed, a checkpoint without a tokenizer refused before anything
starts (by the switch and by ``hotweights serve``), and every 5xx the front answers is JSON. Real processes (the CLI,
a front with embedded engines), and for the 5xx an in-process front in front of an engine that answers plain text.

Run: pytest tests/test_switch_operator.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import tempfile
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from conftest import DaemonProc, run_cli
from switch_front import Front, private_keeper, wait_started

from ports import free_port


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from hotweights.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("operator") / "m", "tiny")


def table(name: str, checkpoint: Path, args: list[str] = (), aliases: list[str] = ()) -> str:
    return (f'[[model]]\nname = "{name}"\ncheckpoint = "{checkpoint}"\nargs = {json.dumps(list(args))}\n'
            + (f"aliases = {json.dumps(list(aliases))}\n" if aliases else ""))


def refused(tmp_path: Path, text: str) -> str:
    """The one line ``hotweights switch --config`` exits with for ``text``, before it binds or starts anything."""
    config = tmp_path / "switch.toml"
    config.write_text(text)
    done = run_cli("switch", "--config", str(config), "--port", str(free_port()), timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode in (1, 2) and len(lines) == 1, (done.returncode, done.stderr[-2000:])
    return lines[0]


def test_flags_the_front_sets_itself_are_refused_in_one_line_naming_the_key_to_use(model, tmp_path):
    """Before: --served-model-name made the model 404 on every request, --port left it starting for 900 s."""
    for args, said in ((["--served-model-name", "gpt-4o-mini"], "--served-model-name is the front's to set (the "
                                                                "engine serves the model's name: set name, or aliases"),
                       (["--port=19091"], "--host/--port/--uds is the front's to set (the front gives each engine a "
                                          "loopback port of its own; the public address is [switch] host and port)"),
                       (["--max-model-len", "64", "--api-key", "k"], "[switch] api_key")):
        line = refused(tmp_path, table("a", model, args))
        assert "[[model]] #1: args: " in line and said in line, line


def test_engine_args_the_engines_own_parser_refuses_are_refused_in_one_line_before_anything_starts(model, tmp_path):
    """Issue 68: a typo in a model's args passed the config check and failed only at its engine's start."""
    said = refused(tmp_path, table("a", model, ["--max-modl-len", "64"]))
    assert said.endswith("model a: --max-modl-len is not an argument of hotweights serve (did you mean "
                         "--max-model-len?)"), said
    said = refused(tmp_path, table("a", model, ["--max-model-len", "lots"]))
    assert "model a: hotweights serve refuses its args: argument --max-model-len: invalid int value: 'lots'" in said
    done = run_cli("switch", "--model", f"a={model}", "--port", str(free_port()), "--", "--devise", "cpu", timeout=60)
    assert done.returncode in (1, 2) and "--devise is not an argument of hotweights serve (did you mean --device?)" \
        in done.stderr.strip().splitlines()[-1], done.stderr  # the quick form's engine args too


def test_aliases_must_be_names_and_none_may_be_another_models_name(model, tmp_path):
    line = refused(tmp_path, table("a", model) + table("b", model, aliases=["c", "a"]))
    assert "model names and aliases must differ: a is named twice" in line, line
    line = refused(tmp_path, table("a", model, aliases=["no spaces"]))
    assert "aliases must be names of letters, digits" in line, line


def test_a_checkpoint_without_a_tokenizer_is_refused_before_anything_starts(model, tmp_path):
    """Before: it passed every check, the front said it was ready, and every request got a plain-text 500."""
    bare = shutil.copytree(model, tmp_path / "bare")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json"):
        (bare / name).unlink(missing_ok=True)
    line = refused(tmp_path, table("a", bare))
    assert f"checkpoint: no tokenizer files in {bare} (tokenizer.json" in line, line
    done = run_cli("serve", str(bare), "--port", str(free_port()), timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "no tokenizer files in" in lines[0], done.stderr[-2000:]
    from hotweights.switch.config import model as model_config

    # vLLM's --tokenizer names another directory: the checkpoint need not hold one
    made = model_config({"name": "a", "checkpoint": str(bare), "engine": "vllm", "args": ["--tokenizer", str(model)]},
                        "[[model]] #1")
    assert made.checkpoint == bare


@pytest.mark.slow
def test_an_alias_is_routed_and_listed_and_every_engine_path_is_relayed_or_a_json_404(model, tmp_path):
    with private_keeper("hwop-") as sock:
        config = tmp_path / "switch.toml"
        config.write_text(table("a", model, ["--max-model-len", "64"], aliases=["gpt-4o-mini", "team/small"]))
        f = wait_started(Front(tmp_path, {}, "--config", str(config), socket_dir=sock))
        try:
            for path, body in (("/v1/completions", {"prompt": "The weight cache"}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
                req = urllib.request.Request(f.url + path, data=json.dumps(
                    {"model": "gpt-4o-mini", "max_tokens": 3, **body}).encode(),
                    headers={"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    got = json.loads(r.read())
                assert got["model"] == "a" and got["choices"], got  # its engine answers by the model's name
            with urllib.request.urlopen(f.url + "/v1/models", timeout=10) as r:
                listed = {m["id"]: m["parent"] for m in json.loads(r.read())["data"]}
            assert listed == {"a": None, "gpt-4o-mini": "a", "team/small": "a"}, listed
            log = f.log.read_text()  # a line per request, and the waits and first bytes in /metrics (issue 53)
            assert re.search(r"switch: request a /v1/completions 200, waited [\d.]+ s, first byte [\d.]+ s, [\d.]+ s "
                             r"in all, 3 tokens", log), log[-2000:]
            with urllib.request.urlopen(f.url + "/metrics", timeout=10) as r:
                scrape = r.read().decode()
            for series in ('hotweights_switch_wait_seconds_count{model="a"} 2.0',
                           'hotweights_switch_first_byte_seconds_count{model="a"} 2.0',
                           'hotweights_switch_requests_total{model="a",outcome="ok"} 2.0'):
                assert series in scrape, series
            with urllib.request.urlopen(f.url + "/v1/models/team/small", timeout=10) as r:
                assert json.loads(r.read())["parent"] == "a"
            with urllib.request.urlopen(f.url + "/version", timeout=10) as r:
                assert json.loads(r.read())["version"]
            # a path the engine's kind does not serve: a JSON 404 that says so (vLLM serves these: its own test)
            for path in ("/v1/embeddings", "/tokenize"):
                req = urllib.request.Request(f.url + path, data=json.dumps({"model": "gpt-4o-mini", "input": "x",
                                                                            "prompt": "x"}).encode(),
                                             headers={"content-type": "application/json"})
                with pytest.raises(urllib.error.HTTPError) as caught:
                    urllib.request.urlopen(req, timeout=30)
                said = json.loads(caught.value.read())["error"]
                assert caught.value.code == 404 and said["message"] == f"the engine of `a` (hotweights) does not " \
                    f"serve {path}", said
        finally:
            f.interrupt()


def test_a_plain_text_5xx_from_an_engine_is_answered_as_json(tmp_path):
    """An engine that fails a request in plain text (an uncaught exception in a server) is relayed as vLLM's JSON
    error, naming the model and the engine's first words; the front's own 5xx are JSON too."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient
    from test_switcher import FakeEngine

    from hotweights.switch.config import ModelConfig, SwitchConfig
    from hotweights.switch.port.front import create_app

    async def broken(_request):
        return PlainTextResponse("Internal Server Error", status_code=500)

    port = free_port()
    engine_server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/completions", broken,
                                                                         methods=["POST"])]),
                                                  host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=engine_server.run, daemon=True)
    thread.start()
    while not engine_server.started:
        time.sleep(0.01)

    def factory(m: ModelConfig) -> FakeEngine:
        engine = FakeEngine(m, [])
        engine.url = f"http://127.0.0.1:{port}"
        return engine

    try:
        app = create_app(SwitchConfig((ModelConfig("a", tmp_path / "a"),)), tmp_path, engines=factory)
        with TestClient(app) as client:
            deadline = time.monotonic() + 10
            while client.get("/health").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            got = client.post("/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 1})
            assert got.status_code == 500 and got.headers["content-type"].startswith("application/json"), got.text
            error = got.json()["error"]
            assert error["message"] == "the engine of `a` answered 500: Internal Server Error", error
            assert error["code"] == 500
    finally:
        engine_server.should_exit = True
        thread.join(10)


@pytest.mark.slow
def test_sigterm_with_a_stream_in_flight_ends_it_with_an_error_event_and_the_front_stops_within_seconds(model,
                                                                                                       tmp_path):
    """Before: SIGTERM said nothing for up to 30 s (uvicorn's graceful shutdown waits for open connections), then
    printed a CancelledError traceback, and the client's stream was cut without an error event or [DONE]."""
    with private_keeper("hwop-") as sock:
        f = wait_started(Front(tmp_path, {"a": model}, socket_dir=sock, engine_args=("--max-model-len", "4096")))
        body = json.dumps({"model": "a", "prompt": "The weight cache", "max_tokens": 4000, "temperature": 0,
                           "stream": True}).encode()  # ~19 s of generation here
        req = urllib.request.Request(f.url + "/v1/completions", data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as stream:
            assert stream.readline().startswith(b"data: {")
            began = time.monotonic()
            f.proc.send_signal(signal.SIGTERM)
            rest = stream.read()
        ended = time.monotonic() - began
        events = [x for x in rest.split(b"\n") if x.startswith(b"data: ")]
        assert events[-1] == b"data: [DONE]", events[-3:]
        assert json.loads(events[-2][6:])["error"]["message"] == "the server is shutting down; retry the request"
        f.proc.wait(30)
        stopped = time.monotonic() - began
        assert ended < 3 and stopped < 6, (ended, stopped)
        log = f.log.read_text()
        assert "switch: stopping: 1 stream(s) ended with an error event, 0 waiting request(s) answered 503" in log
        assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]


@pytest.mark.slow
def test_engines_die_with_their_front_however_it_dies(model, tmp_path):
    """Before: after a kill -9 of the front (or SIGHUP of its terminal) every engine kept running without a parent,
    holding its port and memory."""
    with private_keeper("hwop-") as sock:
        f = wait_started(Front(tmp_path, {"a": model, "b": model}, socket_dir=sock))
        engines = [m["server_pid"] for m in f.status()["models"]]
        assert all(engines) and len(set(engines)) == 2, f.status()
        f.proc.send_signal(signal.SIGKILL)
        f.proc.wait(10)
        deadline = time.monotonic() + 20
        while any(running(pid) for pid in engines):
            assert time.monotonic() < deadline, [pid for pid in engines if running(pid)]
            time.sleep(0.1)


@pytest.mark.slow
def test_a_new_front_retires_the_engines_a_dead_front_left_running(model, tmp_path):
    """An engine that hangs does not act on its dead front's signal (nor did any engine of a front before that fix):
    it kept its port and memory until someone found it. Here both engines are stopped (SIGSTOP) when the front is
    killed, so they outlive it; the next front on that keeper retires them, in one line, before it starts its own."""
    with private_keeper("hwop-") as sock:
        f = wait_started(Front(tmp_path, {"a": model, "b": model}, socket_dir=sock))
        engines = {m["name"]: m["server_pid"] for m in f.status()["models"]}
        deadline = time.monotonic() + 10
        while len(list(Path(sock).glob("switch/*.json"))) != 1:  # its note, written within a second
            assert time.monotonic() < deadline, list(Path(sock).iterdir())
            time.sleep(0.1)
        for pid in engines.values():
            os.kill(pid, signal.SIGSTOP)
        f.proc.send_signal(signal.SIGKILL)
        f.proc.wait(10)
        time.sleep(1)
        g = None
        try:
            assert all(running(pid) for pid in engines.values())  # what a dead front left
            g = wait_started(Front(tmp_path, {"a": model}, socket_dir=sock))
            assert not any(running(pid) for pid in engines.values())
            log = g.log.read_text()
            said = [line for line in log.splitlines() if "retired 2 engine(s)" in line]
            assert len(said) == 1 and f"a dead front (pid {f.proc.pid}) left running" in said[0], log[-3000:]
            assert f"a (pid {engines['a']})" in said[0] and f"b (pid {engines['b']})" in said[0], said
            assert [p.name for p in Path(sock).glob("switch/*.json")] == [f"{g.proc.pid}.json"]  # the dead one's gone
            g.interrupt()
        finally:
            for pid in engines.values():  # whatever failed: nothing stopped stays behind
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if g is not None and g.proc.poll() is None:
                g.interrupt()
        assert not list(Path(sock).glob("switch/*.json"))  # a front that stops takes its note away


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that its new parent has yet to reap does not)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.slow
def test_an_operator_parks_stops_and_starts_a_model_from_the_cli_with_the_configs_port_and_key(model, tmp_path):
    with private_keeper("hwop-") as sock:
        config = tmp_path / "switch.toml"
        models = table("a", model, ["--max-model-len", "64"]) + table("b", model, ["--max-model-len", "64"],
                                                                       aliases=["bee"])
        config.write_text('[switch]\napi_key = "sesame"\n' + models)
        f = Front(tmp_path, {}, "--config", str(config), socket_dir=sock)  # on a port of its own
        port = f.port
        config.write_text(f'[switch]\nport = {port}\napi_key = "sesame"\n' + models)  # what the CLI reads
        try:
            deadline = time.monotonic() + 120
            while not f.ready() or any(m["state"] == "starting" for m in f.status("sesame")["models"]):
                assert time.monotonic() < deadline
                time.sleep(0.2)

            def cli(*args: str) -> str:
                done = run_cli("switch", *args, "--config", str(config), timeout=120)
                assert done.returncode == 0, done.stderr
                return done.stdout.strip()

            assert cli("start", "bee") == "b: awake"  # by its alias; the port and key from the config
            assert cli("park", "b") == "b: parked"
            assert cli("stop", "b") == "b: stopped"
            states = {m["name"]: m["state"] for m in json.loads(cli("status", "--json"))["models"]}
            assert states == {"a": "awake", "b": "stopped"}, states
            done = run_cli("switch", "start", "b", "--port", str(port), "--api-key", "wrong", timeout=60)
            assert done.returncode == 1 and "Unauthorized" in done.stderr, done.stderr
            done = run_cli("switch", "start", "c", "--config", str(config), timeout=60)
            assert done.returncode == 1 and "The model `c` does not exist" in done.stderr, done.stderr
            assert cli("stop", "--all") == "a: stopped\nb: stopped already"  # issue 68: an unload-all
            assert {m["state"] for m in f.status("sesame")["models"]} == {"stopped"}
            assert f.client("sesame").completions.create(model="a", prompt="ab", max_tokens=2).choices  # started
        finally:
            f.interrupt()


@pytest.mark.slow
def test_without_parking_a_switch_says_it_stopped_one_engine_and_started_the_other(model, tmp_path):
    """Before: ``switch: b awake ... (weights start; parked a in 0.165 s; woke b in 1.825 s)``, for a stop and a
    start. And (issue 68) start-up started b only to stop it at once, as its engine cannot park: it is preloaded,
    and started by its first request."""
    with private_keeper("hwop-") as sock:
        f = wait_started(Front(tmp_path, {"a": model, "b": model}, "--no-parking", "--max-awake", "1",
                               socket_dir=sock))
        try:
            assert f.state("b")["state"] == "stopped"  # not started at start-up
            assert f.client().completions.create(model="b", prompt="hi", max_tokens=2).model == "b"
            assert f.client().completions.create(model="a", prompt="hi", max_tokens=2).model == "a"
            shown = run_cli("switch", "status", "--port", str(f.port), timeout=60)
        finally:
            f.interrupt()
        # its status said "(no sleep mode: ...)" of an engine that has one
        assert shown.returncode == 0 and "(parking off: a switch stops and starts it)" in shown.stdout, shown.stdout
        assert "no sleep mode" not in shown.stdout, shown.stdout
        log = f.log.read_text()
        assert ('switch: b start on their first request (start = "cached"): their engines cannot park (parking '
                'is off)') in log, log[-3000:]
        assert "switch: b ready in" in log and "switch: a stopped for b" in log, log[-3000:]
        line = re.search(r"switch: a awake in [\d.]+ s \(weights (\w+); stopped b in [\d.]+ s; started a in [\d.]+ s\)",
                         log)
        assert line and line.group(1) == "start", log[-3000:]
        assert "parked b" not in log and "woke a" not in log, log[-3000:]


def test_a_keeper_stopped_under_a_running_front_is_started_again_before_an_engine_starts_again(model, tmp_path):
    """Issue 68: after ``hotweights stop`` under a running front, an engine started again read its checkpoint and
    only its own log said so. The front now sees the keeper gone, preloads the model again (a keeper starts), says
    so, and the engine maps its weights."""
    with private_keeper("hwop-") as sock:
        f = wait_started(Front(tmp_path, {"a": model, "b": model}, socket_dir=sock))
        try:
            assert run_cli("switch", "stop", "b", "--port", str(f.port), timeout=60).returncode == 0
            assert run_cli("stop", "--socket-dir", str(sock), timeout=60).returncode == 0  # the keeper, under it
            assert f.client().completions.create(model="b", prompt="ab", max_tokens=2).choices  # b starts again
            log = f.log.read_text()
            assert re.search(r"switch: b: no keeper answers \(.*\); preloaded again \(cached", log), log[-3000:]
            assert run_cli("status", "--socket-dir", str(sock), timeout=60).returncode == 0  # a keeper runs again
            b_log = max((tmp_path / f"logs-{f.port}").glob("b*.log"), key=lambda p: p.stat().st_mtime).read_text()
            assert "Mapped " in b_log.rsplit("hotweights serve", 1)[-1] and "falling back" not in b_log, b_log[-3000:]
        finally:
            f.interrupt()


@pytest.mark.slow
def test_a_model_over_the_keepers_max_bytes_is_said_to_be_served_from_disk(model, tmp_path):
    """Before: its preload failed, its engine read the checkpoint, and only the ready line said so."""
    sock = Path(tempfile.mkdtemp(prefix="hwop-", dir="/tmp"))
    keeper = DaemonProc(sock, "--max-bytes", "100000")  # the tiny model needs about 400 kB
    try:
        f = wait_started(Front(tmp_path, {"a": model}, socket_dir=sock))
        try:
            (row,) = f.status()["models"]
            assert row["cached"].startswith("not cached (") and "daemon budget of 100000 bytes" in row["cached"], row
            done = run_cli("switch", "status", "--port", str(f.port), timeout=60)
            assert done.returncode == 0 and done.stdout.strip().splitlines()[-1].startswith(
                "note: a is served from its checkpoint on disk, not cached ("), done.stdout
        finally:
            f.interrupt()
    finally:
        keeper.stop()


@pytest.mark.slow
def test_a_front_started_again_runs_no_preload_for_what_the_keeper_holds_unless_its_files_changed(model, tmp_path):
    """Before: every start of the front ran a ``hotweights preload`` process per model (2-4 s each here), the
    keeper's entries current or not."""
    own = tmp_path / "m"
    shutil.copytree(model, own)

    def ready_line(run: str) -> str:
        f = wait_started(Front(tmp_path / run, {"a": own}, socket_dir=sock))
        f.interrupt()
        return next(line for line in f.log.read_text().splitlines() if "switch: a ready in" in line)

    with private_keeper("hwop-") as sock:
        for run in ("1", "2", "3"):
            (tmp_path / run).mkdir()
        assert "(cached, " in ready_line("1")  # its preload ran
        assert "(cached already; started" in ready_line("2")  # the key checked in the front: no preload
        shard = next(own.glob("*.safetensors"))
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF  # the same size and header, another byte: another key
        shard.write_bytes(bytes(data))
        assert "(cached, " in ready_line("3")  # preloaded again, not served from the stale entry


def test_a_start_mode_is_eager_cached_or_lazy_and_the_default_is_eager(model, tmp_path):
    line = refused(tmp_path, table("a", model) + table("b", model) + 'start = "later"\n')
    assert "start must be one of eager, cached, lazy, got 'later'" in line, line
    line = refused(tmp_path, table("a", model) + 'start = "lazy"\n' + table("b", model))
    assert "the default model (a) starts eagerly, as /health waits for it" in line, line


@pytest.mark.slow
def test_a_lazy_model_starts_for_its_first_request(model, tmp_path):
    with private_keeper("hwop-") as sock:
        config = tmp_path / "switch.toml"
        config.write_text(table("a", model, ["--max-model-len", "64"]) + table("b", model, ["--max-model-len", "64"])
                          + 'start = "lazy"\n')
        f = wait_started(Front(tmp_path, {}, "--config", str(config), socket_dir=sock))
        try:
            assert {m["name"]: m["state"] for m in f.status()["models"]} == {"a": "awake", "b": "stopped"}
            assert "switch: b ready in" not in f.log.read_text()  # nothing done for it at start-up
            req = urllib.request.Request(f.url + "/v1/completions", data=json.dumps(
                {"model": "b", "prompt": "The weight cache", "max_tokens": 3}).encode(),
                headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                assert json.loads(r.read())["model"] == "b"
            assert f.state("b")["state"] == "awake" and "switch: b ready in" in f.log.read_text()
        finally:
            f.interrupt()


def test_a_runs_log_directory_is_new_and_old_runs_are_cleaned(tmp_path):
    """Issue 53: every front without --log-dir left a temporary directory of engine logs behind, forever."""
    import os

    from hotweights.switch.port.front import LOG_PREFIX, new_log_dir

    week_ago = time.time() - 8 * 86400
    runs = []
    for i in range(14):
        run = tmp_path / f"{LOG_PREFIX}{i:02d}"
        (run / "m.log").parent.mkdir()
        (run / "m.log").write_text("x")
        age = week_ago - i * 60 if i else time.time()  # run 00 is still written to (a front that runs)
        os.utime(run / "m.log", (age, age))
        os.utime(run, (age, age))
        runs.append(run)
    (tmp_path / "other").mkdir()
    made = new_log_dir(tmp_path)
    assert made.is_dir() and made.name.startswith(LOG_PREFIX)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted([made.name, "other", *(r.name for r in runs[:9])]), kept  # with the new one, ten
    config = tmp_path / "switch.toml"
    from hotweights.switch import config as switch_config
    from hotweights.demo_model import write_demo_model

    model = write_demo_model(tmp_path / "m", "tiny")
    config.write_text(f'[switch]\nlog_dir = "{tmp_path / "logs"}"\n' + table("a", model))
    assert switch_config.load(config).log_dir == str(tmp_path / "logs")


@pytest.mark.slow
def test_a_requests_keep_alive_sets_how_long_its_model_stays_awake_once_idle(model, tmp_path):
    """Issue 68: Ollama's per-request ``keep_alive`` was refused by the embedded engine; the front now reads it as
    that model's idle timer (in place of ``park_after_s``): ``0`` parks it once its request ends, a negative one
    keeps it awake, and one that is neither seconds nor a duration is refused naming the field."""
    with private_keeper("hwka-") as sock:
        config = tmp_path / "switch.toml"
        config.write_text("[switch]\n" + table("a", model, ["--max-model-len", "64"])
                          + table("b", model, ["--max-model-len", "64"]) + "park_after_s = 1\n")
        f = wait_started(Front(tmp_path, {}, "--config", str(config), socket_dir=sock))
        try:
            client = f.client()
            client.completions.create(model="b", prompt="ab", max_tokens=2, extra_body={"keep_alive": "-1"})
            time.sleep(3)  # past b's park_after_s: its keep_alive keeps it awake
            assert f.state("b")["state"] == "awake"
            client.completions.create(model="b", prompt="ab", max_tokens=2, extra_body={"keep_alive": 0})
            deadline = time.monotonic() + 10
            while f.state("b")["state"] != "parked":
                assert time.monotonic() < deadline, f.log.read_text()[-2000:]
                time.sleep(0.1)
            log = f.log.read_text()
            assert "b stays awake for ever once idle (a request's keep_alive)" in log
            assert re.search(r"b parked after \d+ s idle \(a request's keep_alive\)", log), log[-2000:]
            with pytest.raises(openai.BadRequestError) as err:
                client.completions.create(model="b", prompt="ab", max_tokens=2, extra_body={"keep_alive": "soon"})
            assert err.value.body["param"] == "keep_alive"
        finally:
            f.interrupt()


def until(check, what: str, front: Front, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: {front.log.read_text()[-3000:]}"
        time.sleep(0.1)
    return got


@pytest.mark.slow
def test_a_front_reads_its_config_again_on_sighup_and_reload_and_keeps_it_when_the_new_one_is_bad(model, tmp_path):
    """Issue 68: an edited config was ignored, and SIGHUP ended the front (no shutdown line, a stale note). SIGHUP
    and ``hotweights switch reload`` read it again now: an added model starts, a removed one stops, a changed one
    starts again with its new table; an unchanged one keeps serving, its stream in flight untouched; a config the
    front cannot run is refused in one line and the running one stays."""
    with private_keeper("hwrl-") as sock:
        config = tmp_path / "switch.toml"
        a = table("a", model, ["--max-model-len", "4096"])
        config.write_text("[switch]\n" + a + table("b", model, ["--max-model-len", "64"]))
        f = wait_started(Front(tmp_path, {}, "--config", str(config), socket_dir=sock))
        port = f.port
        try:
            pid_a, said = f.state("a")["pid"], {}

            def stream() -> None:  # about 19 s on the 2-core dev machine: the reloads happen during it
                chunks = list(f.client().completions.create(model="a", prompt="ab", max_tokens=4000, stream=True,
                                                            stream_options={"include_usage": True},
                                                            extra_body={"ignore_eos": True}))
                said["tokens"] = chunks[-1].usage.completion_tokens  # its usage: the stream came to its end

            streaming = threading.Thread(target=stream)
            streaming.start()
            config.write_text(f"[switch]\nport = {port}\n" + a + table("c", model, ["--max-model-len", "64"]))
            f.proc.send_signal(signal.SIGHUP)
            until(lambda: {m["name"]: m["state"] for m in f.status()["models"]}.get("c") in ("awake", "parked"),
                  "c started", f)
            assert "b" not in {m["name"] for m in f.status()["models"]} and f.proc.poll() is None
            assert f.state("c")["last_used"] is None  # never used: start-up's count of idle time is no use (issue 68)
            assert "(SIGHUP): added c; removed b" in f.log.read_text()
            with pytest.raises(openai.NotFoundError):
                f.client().completions.create(model="b", prompt="ab", max_tokens=2)
            pid_c = f.state("c")["pid"]
            config.write_text(f"[switch]\nport = {port}\n" + a + table("c", model, ["--max-model-len", "32"]))
            done = run_cli("switch", "reload", "--config", str(config), timeout=120)
            assert done.returncode == 0 and done.stdout.strip() == "reloaded: changed c", done
            until(lambda: f.state("c")["state"] in ("awake", "parked") and f.state("c")["pid"] != pid_c,
                  "c started again", f)
            config.write_text(f"[switch]\nport = {port}\nnope = 1\n" + a)
            done = run_cli("switch", "reload", "--port", str(port), timeout=60)
            assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done
            assert "reload refused: " in done.stderr and "unknown key 'nope'" in done.stderr, done.stderr
            config.write_text(f"[switch]\nport = {port}\nparking = false\n" + a)
            done = run_cli("switch", "reload", "--port", str(port), timeout=60)
            assert "parking cannot change while the front runs" in done.stderr, done.stderr
            assert {m["name"] for m in f.status()["models"]} == {"a", "c"}  # the running configuration stays
            streaming.join(120)
            assert said["tokens"] == 4000 and f.state("a")["pid"] == pid_a  # a's stream went on, whole
        finally:
            f.interrupt()


@pytest.mark.slow
def test_with_watch_config_a_changed_file_is_read_again_by_itself(model, tmp_path):
    with private_keeper("hwwc-") as sock:
        config = tmp_path / "switch.toml"
        config.write_text("[switch]\n" + table("a", model, ["--max-model-len", "64"]))
        f = wait_started(Front(tmp_path, {}, "--config", str(config), "--watch-config", socket_dir=sock))
        try:
            config.write_text(f"[switch]\nport = {f.port}\n" + table("a", model, ["--max-model-len", "64"])
                              + table("b", model, ["--max-model-len", "64"]))
            until(lambda: "b" in {m["name"] for m in f.status()["models"]}, "b added", f, 30)
            assert "(the file changed): added b" in f.log.read_text()
        finally:
            f.interrupt()


@pytest.mark.slow
def test_sighup_to_a_front_without_a_config_file_is_said_and_the_front_goes_on(model, tmp_path):
    """Issue 68: SIGHUP ended the front with no shutdown line and a stale note file."""
    with private_keeper("hwhu-") as sock:
        f = wait_started(Front(tmp_path, {"a": model}, socket_dir=sock))
        try:
            f.proc.send_signal(signal.SIGHUP)
            until(lambda: "nothing to read again" in f.log.read_text(), "the SIGHUP said", f, 10)
            assert f.proc.poll() is None and f.ready()
        finally:
            assert f.interrupt() in (0, 130)
