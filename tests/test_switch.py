"""``hotweights switch``: real fronts in subprocesses, real embedded engines behind them (two demo models with
different bytes), the official ``openai`` client. Routing by model, the batch that waited for a switch, a stream
through a switch, a killed engine started again, the metrics, the API key, Ctrl-C freeing every port; the
configuration's refusals.

Run: pytest tests/test_switch.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import run_cli
from switch_front import private_keeper, wait_started, Front, answer, checkpoint_names, port_free

from hotweights.switch import config as switch_config


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> dict[str, Path]:
    from hotweights.demo_model import write_demo_model

    root = tmp_path_factory.mktemp("switch-models")
    return {"chat": write_demo_model(root / "chat", "tiny"), "coder": write_demo_model(root / "coder", "tiny", seed=1)}


@pytest.fixture(scope="module")
def keeper():
    with private_keeper("hwsw-") as sock:
        yield sock


@pytest.fixture(scope="module")
def front(two_models, keeper, tmp_path_factory):
    # one engine awake at a time (the cap): these tests switch (by default both would stay awake, as they fit)
    f = wait_started(Front(tmp_path_factory.mktemp("switch"), two_models, "--max-awake", "1", socket_dir=keeper))
    yield f
    if f.proc.poll() is None:
        f.interrupt()


@pytest.mark.slow
def test_every_model_is_listed_started_and_cached_and_an_unknown_one_is_404(front):
    import openai

    client = front.client()
    assert [m.id for m in client.models.list().data] == ["chat", "coder"]
    with pytest.raises(openai.NotFoundError, match="The model `nobody` does not exist"):
        client.completions.create(model="nobody", prompt="x", max_tokens=1)
    states = {m["name"]: m["state"] for m in front.status()["models"]}
    assert states == {"chat": "awake", "coder": "parked"}  # the default awake, the other started and parked
    text = front.log.read_text()
    assert "chat ready in" in text and re.search(r"coder ready in [\d.]+ s \(cached, [\d.]+ s; started, [\d.]+ s; "
                                                 r"parked\)", text), text


@pytest.mark.slow
def test_requests_go_to_their_own_model_across_switches(front):
    client = front.client()
    chat, coder = answer(client, "chat"), answer(client, "coder")
    assert chat[1] != coder[1]  # two models with different bytes answer differently
    for name, expected in (("chat", chat), ("coder", coder), ("chat", chat), ("coder", coder)):
        assert answer(client, name) == expected
    assert front.state("coder")["wakes"] >= 2 and front.state("chat")["wakes"] >= 2
    assert {m["state"] for m in front.status()["models"]} == {"awake", "parked"}  # max_awake 1


@pytest.mark.slow
def test_requests_that_arrive_together_are_each_answered_by_their_model(front):
    client = front.client()
    expected = {name: answer(client, name) for name in ("chat", "coder")}
    got: list[tuple[str, tuple]] = []
    names = ["chat", "coder"] * 4
    threads = [threading.Thread(target=lambda n=n: got.append((n, answer(client, n)))) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(names) and all(a == expected[n] for n, a in got)


@pytest.mark.slow
def test_a_stream_through_a_switch_arrives_whole(front):
    client = front.client()
    answer(client, "chat")  # chat awake, coder parked
    plain = client.chat.completions.create(model="coder", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=6, temperature=0).choices[0].message.content
    answer(client, "chat")
    chunks = list(client.chat.completions.create(model="coder", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=6, temperature=0, stream=True))
    assert all(c.model == "coder" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain


@pytest.mark.slow
def test_a_killed_engine_starts_again_on_its_next_request(front):
    """Not the default (its engine starts again by itself: tests/test_switch_faults.py): the next request starts it."""
    client = front.client()
    expected = answer(client, "coder")
    pid = front.state("coder")["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while front.state("coder")["state"] != "failed":
        assert time.monotonic() < deadline, front.status()
        time.sleep(0.1)
    assert answer(client, "coder") == expected
    row = front.state("coder")
    assert row["state"] == "awake" and row["pid"] != pid
    with urllib.request.urlopen(front.url + "/metrics") as r:
        scrape = r.read().decode()
    assert 'hotweights_switch_switches_total{model="coder",source="restart"} 1.0' in scrape
    assert 'hotweights_switch_model_state{model="coder",state="awake"} 1.0' in scrape
    assert "hotweights_switch_switch_seconds_bucket" in scrape and "hotweights_switch_waiting_requests" in scrape


@pytest.mark.slow
def test_status_prints_a_row_per_model(front):
    done = run_cli("switch", "status", "--port", str(front.port))
    assert done.returncode == 0, done.stderr
    assert "chat *" in done.stdout and "coder" in done.stdout and "GPU MiB" in done.stdout
    assert json.loads(run_cli("switch", "status", "--port", str(front.port), "--json").stdout)["default"] == "chat"


@pytest.mark.slow
def test_an_api_key_guards_the_front_a_model_that_cannot_start_is_unavailable_and_ctrl_c_frees_every_port(
        two_models, keeper, tmp_path):
    import openai

    broken = shutil.copytree(two_models["chat"], tmp_path / "broken")
    (broken / "tokenizer.json").write_text("{}")  # a checkpoint its engine cannot start: a broken tokenizer
    f = Front(tmp_path, {"chat": two_models["chat"], "broken": tmp_path / "broken"}, "--api-key", "sesame",
              socket_dir=keeper)
    with pytest.raises(openai.AuthenticationError):
        f.client("wrong").models.list()
    assert answer(f.client("sesame"), "chat")
    deadline = time.monotonic() + 60
    while f.status("sesame")["models"][1]["state"] != "failed":
        assert time.monotonic() < deadline, f.status("sesame")
        time.sleep(0.2)
    with pytest.raises(openai.InternalServerError, match="broken: its engine exited with code"):
        f.client("sesame").completions.create(model="broken", prompt="x", max_tokens=1)
    assert answer(f.client("sesame"), "chat")  # the others serve
    engine = f.status("sesame")["models"][0]
    # a front started again (the module's front ran before) finds the keeper's weights: the engine maps them
    assert "Mapped " in Path(engine["log"]).read_text() and "falling back" not in Path(engine["log"]).read_text()
    assert f.interrupt() in (0, 130)  # 130: uvicorn re-raises the SIGINT it caught, as a shell expects
    assert "every engine stopped" in f.log.read_text()
    assert port_free(f.port) and port_free(engine["port"])
    with pytest.raises(ProcessLookupError):
        os.kill(engine["pid"], 0)


@pytest.mark.slow
def test_without_parking_a_switch_stops_one_engine_and_starts_the_other(two_models, keeper, tmp_path):
    """What the vLLM CPU build gets (no sleep mode), and what llama-swap does: the same answers, engines stopped."""
    f = Front(tmp_path, two_models, "--no-parking", "--max-awake", "1", socket_dir=keeper)
    try:
        deadline = time.monotonic() + 60
        while f.state("coder")["state"] != "stopped":
            assert time.monotonic() < deadline, f.status()
            time.sleep(0.2)
        client = f.client()
        chat = answer(client, "chat")
        coder = answer(client, "coder")
        assert f.state("chat")["state"] == "stopped" and f.state("chat")["pid"] == 0
        assert answer(client, "chat") == chat and answer(client, "coder") == coder
        assert not f.state("coder")["parks"] and "coder ready in" in f.log.read_text()
    finally:
        f.interrupt()


@pytest.mark.slow
def test_preloads_run_beside_each_other_ahead_of_the_starts_from_an_empty_keeper(two_models, tmp_path):
    """``--preload-jobs 2``: both models' preloads run at once (a vLLM preload is a whole vLLM start), the starts
    one after the other as before, every model answers."""
    with private_keeper("hwpj-") as sock:
        f = wait_started(Front(tmp_path, two_models, "--preload-jobs", "2", "--max-awake", "1", socket_dir=sock))
        try:
            log = f.log.read_text()
            assert "coder: preloading beside 1 other preload(s)" in log, log
            assert re.search(r"chat ready in [\d.]+ s \(cached, [\d.]+ s; started", log), log
            client = f.client()
            assert answer(client, "chat") != answer(client, "coder")  # each by its own engine (their logprobs)
            assert {m["state"] for m in f.status()["models"]} == {"awake", "parked"}
        finally:
            f.interrupt()


@pytest.mark.slow
def test_weights_parked_in_host_memory_leave_the_keepers_gpu_tier_and_a_request_that_waits_too_long_gets_a_503(
        two_models, keeper, tmp_path):
    """``--parked-weights host``: a parked engine is deep-parked and the keeper keeps only the host copy of its
    entry (the CPU stand-in of the GPU tier released), so its wake uploads them (``weights from host``). The
    same front's timeout: a request that waits too long is answered 503, and the switch it waited for goes on."""
    import openai

    f = Front(tmp_path, two_models, "--request-timeout-s", "0.001", "--parked-weights", "host", "--max-awake", "1",
              socket_dir=keeper)
    try:
        deadline = time.monotonic() + 60
        while "coder ready in" not in f.log.read_text():  # started, parked, and its weights moved
            assert time.monotonic() < deadline, f.status()
            time.sleep(0.2)
        assert f.state("coder")["state"] == "deep-parked" and "to host memory" in f.log.read_text()
        rows = {r["model"]: r for r in json.loads(run_cli("status", "--json", "--socket-dir", str(keeper)).stdout)
                ["entries"] if r["parked"]}
        assert rows["coder"]["nbytes"] == 0 and rows["coder"]["host_nbytes"] > 0, rows  # only the host copy is left
        with pytest.raises(openai.InternalServerError, match="the model `coder` was not awake within"):
            f.client().completions.create(model="coder", prompt="x", max_tokens=1)
        while f.state("coder")["state"] != "awake":  # the switch was not cancelled with the request
            assert time.monotonic() < deadline, f.status()
            time.sleep(0.05)
        assert answer(f.client(), "coder")  # awake: served without waiting
        assert f.state("coder")["inflight"] == 0 and f.state("coder")["waiting"] == 0  # nothing left counted
        assert "(weights from host)" in Path(f.state("coder")["log"]).read_text()
        with urllib.request.urlopen(f.url + "/metrics") as r:
            assert 'source="host"' in r.read().decode()
        assert f.state("chat")["state"] == "deep-parked"  # parked for coder, its weights off the GPU tier too
    finally:
        f.interrupt()


@pytest.mark.slow
def test_a_front_started_again_makes_the_device_copy_of_a_host_tier_model_from_its_host_copy_with_no_preload(
        two_models, tmp_path):
    """A host-tier model that the front before parked has only its host copy left in the keeper. A front started
    again counts it cached (no preload process: for vLLM a whole start per model) and makes its device copy again
    from the host copy (``hotweights promote``) for its start to map; it answers as it did."""
    args = ("--parked-weights", "host", "--max-awake", "1")
    with private_keeper("hwpr-") as keeper:
        (tmp_path / "1").mkdir()
        first = wait_started(Front(tmp_path / "1", two_models, *args, socket_dir=keeper))
        try:
            before = answer(first.client(), "coder")  # coder awake, chat parked
            answer(first.client(), "chat")  # and back: coder parked, its weights to host memory
            assert first.state("coder")["state"] == "deep-parked"
        finally:
            first.interrupt()

        def rows() -> dict[str, dict]:
            return {r["model"]: r for r in json.loads(run_cli("status", "--json", "--socket-dir", str(keeper)).stdout)
                    ["entries"]}

        assert rows()["coder"]["nbytes"] == 0 and rows()["coder"]["host_nbytes"] > 0  # only the host copy is left
        (tmp_path / "2").mkdir()
        second = wait_started(Front(tmp_path / "2", two_models, *args, socket_dir=keeper))
        try:
            text = second.log.read_text()
            # no preload process for either; chat, awake when the first front stopped, had both copies: its GPU copy
            # is let go until its start (the switch counts a host-tier model's weights only while it is resident)
            assert re.search(r"coder ready in [\d.]+ s \(cached already; started", text), text
            assert re.search(r"chat ready in [\d.]+ s \(cached already \(its GPU copy let go until its start, "
                             r"[\d.]+ (KiB|MiB|bytes)\); started", text), text
            for name in ("chat", "coder"):  # each start made its GPU copy again, from the host copy
                assert re.search(rf"switch: {name}: its GPU copy made from its host copy, [\d.]+ s", text), text
            assert answer(second.client(), "coder") == before
            assert rows()["coder"]["nbytes"] > 0  # awake: the device copy published again
        finally:
            second.interrupt()


def _load(tmp_path: Path, text: str) -> switch_config.SwitchConfig:
    path = tmp_path / "switch.toml"
    path.write_text(text)
    return switch_config.load(path)


def test_a_models_gpus_are_indices_among_those_the_front_sees(tmp_path, monkeypatch):
    text = f"[[model]]\nname = 'a'\ncheckpoint = '{checkpoint_names(tmp_path / 'm')}'\ngpus = [1]\n"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _load(tmp_path, text).models[0].cuda_visible_devices() == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-5e1f")
    assert _load(tmp_path, text).models[0].cuda_visible_devices() == "GPU-5e1f"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(switch_config.ConfigError, match=r"gpus \[1\], but the front sees 1 GPU\(s\)"):
        _load(tmp_path, text)


def test_the_config_file_names_what_is_wrong(tmp_path):
    checkpoint_names(tmp_path / "m")
    good = f'[switch]\nport = 9000\nmax_awake = 2\n[[model]]\nname = "a"\ncheckpoint = "{tmp_path / "m"}"\n'
    config = _load(tmp_path, good + f'[[model]]\nname = "b"\ncheckpoint = "{tmp_path / "m"}"\ndefault = true\n'
                                    'engine = "vllm"\nargs = ["--max-model-len", "512"]\nparked_weights = "host"\n')
    assert (config.port, config.max_awake, config.default.name) == (9000, 2, "b")
    assert config.models[1].args == ("--max-model-len", "512") and config.models[1].level == 2  # host: deep park
    assert config.models[0].level == 1 and config.models[0].parked_weights == "gpu"
    for text, message in (
            (good + f"[[model]]\nname = \"a\"\ncheckpoint = \"{tmp_path / 'm'}\"\n", "a is named twice"),
            (good.replace("port = 9000", "prot = 9000"), "unknown key 'prot'"),
            (good + 'engine = "sglang"\n', "engine must be one of hotweights, vllm"),
            (good.replace(str(tmp_path / "m"), "/nonexistent"),
             "checkpoint: model directory /nonexistent does not exist"),
            (good.replace(str(tmp_path / "m"), str(tmp_path)), f"checkpoint: no \\*.safetensors files in {tmp_path}"),
            ("[switch]\n", "no model"),
            (good + "park_level = 3\n", "park_level must be 1 or 2"),
            (good + 'parked_weights = "disk"\n', "parked_weights must be gpu or host"),
            (good.replace("max_awake = 2", "max_awake = 'two'"), 'max_awake must be "auto" or at least 1'),
            (good.replace("max_awake = 2", "max_awake = 0"), 'max_awake must be "auto" or at least 1, got 0'),
            (good.replace("max_awake = 2", "request_timeout_s = -5"), "request_timeout_s must be positive"),
            (good.replace("max_awake = 2", "turn_s = -1"), r"turn_s must be 0 or more"),
            (good.replace("max_awake = 2", "overlap_after_s = 2"), r"overlap_after_s is gone \(a wake goes beside"),
            (good.replace("max_awake = 2", "preload_jobs = -1"), r"preload_jobs must be 0 \(auto\) or more"),
            (good.replace("max_awake = 2", "start_jobs = -2"), r"start_jobs must be 0 \(auto\) or more"),
            (good.replace("port = 9000", 'port = "9000"'), r"port must be a whole number \(1-65535\), got '9000'"),
            (good.replace("port = 9000", "port = true"), r"port must be a whole number \(1-65535\), got True"),
            (good.replace("port = 9000", "port = 0"), "port must be 1-65535, got 0"),
            (good.replace("checkpoint = ", "chekpoint = "), "unknown key 'chekpoint'"),  # not "checkpoint is required"
            (good + 'args = "--max-model-len 512"\n', "args must be a list of strings, got '--max-model-len 512'"),
            (good + "park_after_s = -1\n", r"park_after_s must be 0 \(never\) or more seconds, got -1"),
            (good + 'start = "later"\n', "start must be one of eager, cached, lazy, got 'later'"),
            ("[model]\nname = 'a'\n", "models are [[model]] tables"),
            ("[[model]\n", "not TOML"),
            (f"[[model]]\nname = 'a'\ncheckpoint = '{tmp_path}'\ngpus = [0, 0]\n",
             "gpus must be distinct GPU indices"),
            (f"[[model]]\nname = 'a'\ncheckpoint = '{tmp_path}'\nengine = 'vllm'\ngpus = [0]\n"
             "args = ['--tensor-parallel-size', '2']\n",
             "gpus lists 1 GPU\\(s\\) but --tensor-parallel-size 2 needs 2"),
            (f"[[model]]\nname = 'a'\ncheckpoint = '{tmp_path}'\nengine = 'vllm'\ngpus = [0]\n"
             "args = ['-tp=2']\n", "gpus lists 1 GPU"),
            (f"[[model]]\nname = 'a'\ncheckpoint = '{tmp_path}'\nengine = 'vllm'\n"
             "args = ['--tensor-parallel-size', 'two']\n", "args: --tensor-parallel-size takes a whole number")):
        with pytest.raises(switch_config.ConfigError, match=message.replace("[", r"\[")):
            _load(tmp_path, text)
    done = run_cli("switch", "--model", "nameonly")
    assert done.returncode == 2 and "--model takes NAME=DIR, got 'nameonly'" in done.stderr


def test_an_engines_gpu_memory_is_counted_over_its_process_tree():
    """vLLM's engine core and workers are children of the server the switch started: status sums them all."""
    from hotweights.unix import descendants

    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, "
                              "'-c', 'import time; time.sleep(30)']); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(child.pid)) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert child.pid in descendants(os.getpid()) and len(descendants(child.pid)) == 1
    finally:
        for pid in [*descendants(child.pid), child.pid]:
            os.kill(pid, signal.SIGKILL)
        child.wait()


def test_a_host_tier_model_gets_its_host_copy_after_its_preload_not_at_its_first_park(tmp_path):
    """Made at the first park, each host-tier model's host copy held start-up's next start back ~20 s (H200, four 8B
    on the host tier); after the preload it runs beside the starts. ``hotweights demote`` itself, with a real keeper
    and engines: tests/test_serve_park.py; here, which models ask for it and how a failure reads."""
    from hotweights.switch.upstream.engines import Engine

    made: list[str] = []

    def engine(name: str, tier: str, copies: object) -> Engine:
        e = Engine(switch_config.ModelConfig(name, tmp_path / name, engine="vllm", parked_weights=tier), tmp_path)
        e.parks = True
        e.keeper.cached = lambda: True  # the keeper holds it: no preload process ("cached already")
        e.keeper.host_copy_ahead = copies
        e.keeper.device_copy_off = lambda: 0  # no GPU copy left over by a front before (the test above has one)
        return e

    def copies() -> int:
        made.append("host")
        return 1

    def fails() -> int:
        raise OSError("no keeper answers")

    assert str(engine("h", "host", copies).preload()).startswith("cached already (its host copy made, ")
    assert str(engine("g", "gpu", copies).preload()) == "cached already" and made == ["host"]
    said = engine("f", "host", fails).preload()
    assert not said.failed and str(said) == "cached already (no host copy yet: no keeper answers)"
    both = engine("b", "host", lambda: 0)
    both.keeper.device_copy_off = lambda: 15 << 30  # a front before left both copies: the GPU one goes until its start
    assert str(both.preload()) == "cached already (its GPU copy let go until its start, 15.00 GiB)"
    both.keeper.device_copy_off = lambda: 0
    assert str(both.preload()) == "cached already"


def test_a_host_tier_start_that_fails_lets_the_gpu_copy_made_for_it_go(tmp_path):
    """The front counts a host-tier model's weights on the GPU only while its engine is resident: a GPU copy made
    for a start that then failed would be held uncounted (on an H200, such copies made five starts beside fail)."""
    from hotweights.switch.upstream.engines import Engine
    from hotweights.switch.upstream.process import EngineError

    e = Engine(switch_config.ModelConfig("h", tmp_path / "h", engine="vllm", parked_weights="host"), tmp_path)
    e.parks, let_go = True, []
    e.keeper.promote = lambda: 1
    e.keeper.device_copy_off = lambda: let_go.append("h") or 1

    def fails(command, timeout_s):
        raise EngineError("h: its engine exited with code 1 while starting: no room")

    e.process.start = fails
    with pytest.raises(EngineError, match="no room"):
        e.start()
    assert let_go == ["h"]


def test_a_parking_vllm_engine_is_preloaded_with_the_flags_it_starts_with(tmp_path):
    """``--enable-sleep-mode`` is in vLLM's compile-cache key: a preload without it left the first start of each
    parking engine compiling again (23-31 s on an H200). The load format's own flags stay the start's."""
    from hotweights.switch.upstream.engines import Engine

    model = switch_config.ModelConfig("a", tmp_path / "m", engine="vllm",
                                      args=("--max-model-len", "512", "--load-format", "hotweights"))
    engine = Engine(model, tmp_path)
    engine.parks = True  # as on vLLM's GPU build (its CPU build has no sleep mode: no parking there)
    cmd, env = engine.command(0)
    assert cmd.count("--enable-sleep-mode") == 1 and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["HOTWEIGHTS_STANDBY_IMPORT"] == "now"  # its starts follow one another: the next standby imports now
    assert engine.preload_command() == ["preload", "--engine", "vllm", "--model", str(tmp_path / "m"),
                                        "--tensor-parallel-size", "1", "--vllm-arg=--max-model-len", "--vllm-arg=512",
                                        "--vllm-arg=--enable-sleep-mode"]
    engine.parks = False
    assert "--enable-sleep-mode" not in engine.command(0)[0] + engine.preload_command()
    # TP=2: the preload's own flag (it waits for an entry of each rank), not one it passes on to vLLM
    tp2 = Engine(switch_config.ModelConfig("b", tmp_path / "m", engine="vllm",
                                           args=("-tp", "2", "--load-format=hotweights", "--dtype", "bfloat16")),
                 tmp_path, parking=False)
    assert tp2.preload_command()[5:] == ["--tensor-parallel-size", "2", "--vllm-arg=--dtype", "--vllm-arg=bfloat16"]


def test_a_start_after_its_gpu_copy_is_made_again_counts_the_copy_once(tmp_path, monkeypatch):
    """A host-tier model's start after a restart makes its GPU copy from its host copy first; the seconds its start
    says are the copy's and the engine's. Its ready line said 30.6 s for a 5.9 s copy and a 12.4 s start (H200): the
    engine's start was counted twice."""
    from hotweights.switch.upstream.engines import Engine

    e = Engine(switch_config.ModelConfig("a", tmp_path / "m"), tmp_path)

    def copy_back() -> str:
        time.sleep(0.2)
        return "its GPU copy made from its host copy, 0.2 s"

    def process_start(command, timeout_s: float) -> float:
        time.sleep(0.3)
        return 0.3

    monkeypatch.setattr(e, "device_copy_back", copy_back)
    monkeypatch.setattr(e.process, "start", process_start)
    took = e.start()
    assert 0.5 <= took < 0.7, took


def test_vllm_engines_whose_starts_go_together_keep_a_standby_for_each_start(tmp_path):
    """Starts of a batch (``start_jobs``) each take a warm standby: with one kept, the others imported vLLM
    themselves (H200, 33.7-36.9 s against 16.3-18.6 s). One start at a time keeps one. Engines that profile the GPU
    keep as many: the models after the first take its KV cache and start together (with 2 places, the second of two
    waited 12 s for a standby on an H100). Each keeps one more for the preloads' loaders, which run in standbys too:
    with none to spare, a start right after a preload waited 17-25 s for the next to import (H200, three 8B, the
    front's defaults)."""
    from hotweights.standby.handoff import PLACES_ENV
    from hotweights.switch.upstream.engines import Engine
    from hotweights.switch.memory import GpuNeed

    def env(start_jobs: int, need: GpuNeed, engine: str = "vllm") -> dict[str, str]:
        e = Engine(switch_config.ModelConfig("a", tmp_path / "m", engine=engine), tmp_path, start_jobs=start_jobs)
        e._need = need  # as read on a GPU box (here vLLM's CPU build, or none: no GPU need)
        return e.env("")

    pinned, profiles = GpuNeed((0,), 0.25, 15000, engine_kv_mib=2048), GpuNeed((0,), 0.25, 15000)
    assert env(3, pinned)[PLACES_ENV] == "4"
    assert env(3, profiles)[PLACES_ENV] == "4"  # the first alone, the others together with its KV cache
    assert env(1, pinned)[PLACES_ENV] == "2"
    assert PLACES_ENV not in env(3, pinned, engine="hotweights")  # no standby: nothing imports ahead


def test_a_vllm_model_with_its_own_load_format_in_either_spelling_is_started_with_it_and_not_preloaded(tmp_path):
    """The review's bug: ``--load-format=auto`` was not preloaded, yet started with ``--load-format hotweights``."""
    from hotweights.switch.upstream.engines import Engine

    for args in (("--load-format=auto",), ("--load-format", "auto")):
        engine = Engine(switch_config.ModelConfig("a", tmp_path / "m", engine="vllm", args=args), tmp_path)
        cmd, _ = engine.command(0)
        assert "hotweights" not in cmd[cmd.index("serve") + 1:] and all(a in cmd for a in args), cmd
        assert str(engine.preload()).startswith("not preloaded (--load-format auto"), args
    engine = Engine(switch_config.ModelConfig("a", tmp_path / "m", engine="vllm"), tmp_path)
    cmd, _ = engine.command(0)
    assert cmd[cmd.index("--load-format") + 1] == "hotweights"  # the default: the engine layout, zero-copy


@pytest.mark.slow
def test_engines_on_gpus_of_their_own_stay_awake_together_and_one_that_spans_them_parks_both(two_models, keeper,
                                                                                              tmp_path):
    """``gpus`` per model: its engine (and preload) runs with that CUDA_VISIBLE_DEVICES, and ``max_awake`` counts
    per GPU: a model on GPU 0 and one on GPU 1 are awake at once; one on both (TP=2) parks them both first."""
    from hotweights.demo_model import write_demo_model

    wide = write_demo_model(tmp_path / "wide", "tiny", seed=2)
    rows = [("left", two_models["chat"], [0]), ("right", two_models["coder"], [1]), ("wide", wide, [0, 1])]
    (tmp_path / "switch.toml").write_text("[switch]\nmax_awake = 1\n" + "".join(
        f'[[model]]\nname = "{name}"\ncheckpoint = "{path}"\nargs = ["--max-model-len", "64"]\ngpus = {gpus}\n'
        for name, path, gpus in rows))
    f = Front(tmp_path, {}, "--config", str(tmp_path / "switch.toml"), socket_dir=keeper)
    try:
        deadline = time.monotonic() + 120
        while any(m["state"] == "starting" for m in f.status()["models"]):
            assert time.monotonic() < deadline, f.status()
            time.sleep(0.2)
        client = f.client()
        for name in ("left", "right"):
            assert answer(client, name)
        states = {m["name"]: m["state"] for m in f.status()["models"]}
        assert states == {"left": "awake", "right": "awake", "wide": "parked"}, states
        environ = Path(f"/proc/{f.state('right')['pid']}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=1" in environ and f.state("wide")["gpus"] == [0, 1]
        assert answer(client, "wide")
        states = {m["name"]: m["state"] for m in f.status()["models"]}
        assert states == {"left": "parked", "right": "parked", "wide": "awake"}, states
        done = run_cli("switch", "status", "--port", str(f.port))
        assert re.search(r"wide\s+awake\s+hotweights\s+0,1 ", done.stdout), done.stdout
    finally:
        f.interrupt()


GROUP = ("import os, subprocess, sys, time; os.setpgid(0, 0); "
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('up', flush=True); "
         "time.sleep(60)")


def test_a_dead_server_of_a_standby_start_is_no_live_engine_and_its_orphans_are_stopped(tmp_path):
    """On an H200 a killed vLLM API server (a warm standby's child, leading a group of its own) left its engine
    core behind, holding the port: a wake sent there hung for 300 s. The engine counts as dead once its server is,
    and stopping it ends what the server left in its group."""
    from hotweights.switch.upstream.process import EngineProcess
    from hotweights.unix import signal_group

    engine = EngineProcess("a", tmp_path / "a.log")
    engine.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    server = subprocess.Popen([sys.executable, "-c", GROUP], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        engine.server = server.pid
        assert engine.alive()
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        assert not engine.alive() and signal_group(server.pid, 0)  # its orphan lives on in its group
        engine.stop(grace_s=5)
        assert not signal_group(server.pid, 0)
    finally:
        signal_group(server.pid, signal.SIGKILL)


HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_an_engine_whose_port_another_process_took_first_starts_on_another(tmp_path):
    """Issue 67: a port is picked free, then bound by the engine; another process that binds it in between made the
    engine exit on ``Address already in use``, and the start fail. It now picks another port (``PORT_TRIES``)."""
    import socket

    from hotweights.switch.upstream.process import EngineError, EngineProcess

    taken: list[socket.socket] = []

    def command(port: int, takes: int) -> tuple[list[str], dict[str, str]]:
        if len(taken) < takes:  # another process binds it first
            taken.append(socket.create_server(("127.0.0.1", port)))
        return [sys.executable, "-c", HEALTH_SERVER, str(port)], dict(os.environ)

    engine = EngineProcess("a", tmp_path / "a.log")
    try:
        assert engine.start(lambda port: command(port, 1), timeout_s=60) > 0
        assert engine.alive() and engine.port != taken[0].getsockname()[1]
        assert "Address already in use" in (tmp_path / "a.log").read_text()
    finally:
        engine.stop(grace_s=5)
    with pytest.raises(EngineError, match="Address already in use"):  # every pick taken: the start fails, says why
        engine.start(lambda port: command(port, 1 + len(taken)), timeout_s=60)
    for sock in taken:
        sock.close()


def test_stopping_the_group_of_a_dead_server_ends_what_it_left():
    from hotweights.unix import signal_group, stop_group

    server = subprocess.Popen([sys.executable, "-c", GROUP], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        assert signal_group(server.pid, 0)
        stop_group(server.pid, 5)  # what the standby does when its server dies (zygote._supervise)
        deadline = time.monotonic() + 5
        while signal_group(server.pid, 0):  # the orphan's parent (init) reaps it
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        signal_group(server.pid, signal.SIGKILL)
