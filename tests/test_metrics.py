"""Prometheus metrics, scraped for real and parsed with ``prometheus-client``'s own parser: the daemon's
(``hotweights daemon --metrics-port``) and the embedded server's (``GET /metrics``).

Run: pytest tests/test_metrics.py
"""

from __future__ import annotations

import dataclasses
import urllib.request

import pytest
from conftest import DaemonProc, free_port, run_cli
from prometheus_client.parser import text_string_to_metric_families

from hotweights.client import connect
from hotweights.config import AttachConfig
from hotweights.loading.attach import attach_tensors
from hotweights.loading.preload import preload

pytestmark = pytest.mark.slow  # a daemon and a server in subprocesses


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_daemon_counts_what_it_serves_and_reports_what_it_holds(models, socket_dir):
    port = free_port()
    d = DaemonProc(socket_dir, "--metrics-port", str(port), "--max-bytes", "1G")
    try:
        key = preload(models["tiny"], socket_dir=str(socket_dir)).key
        assert attach_tensors(key, AttachConfig(socket_dir=str(socket_dir))).ok
        with connect(d.paths) as client:
            assert client.attach(dataclasses.replace(key, dtype="float16")).answer().outcome.value == "mismatch"
            assert client.lookup(dataclasses.replace(key, dtype="float16")).outcome.value == "mismatch"  # no attach
        m = scrape(f"http://127.0.0.1:{port}/metrics")
        assert m[("hotweights_attach_total", (("result", "ok"),))] == 1
        assert m[("hotweights_attach_total", (("result", "mismatch"),))] == 1
        assert m[("hotweights_attach_duration_seconds_count", ())] == 2
        assert m[("hotweights_publish_total", (("result", "ok"),))] == 1
        assert m[("hotweights_entries", ())] == 1
        assert m[("hotweights_resident_bytes", (("device", "cpu"), ("tier", "host")))] > 0
        assert m[("hotweights_budget_bytes", ())] == 1 << 30
        assert 0 < m[("hotweights_open_fds", ())] < m[("hotweights_max_fds", ())]
        assert m[("hotweights_last_served_timestamp_seconds", ())] > 0
        assert ("hotweights_clients", ()) in m
        assert m[("hotweights_entry_host_copy_bytes", (("key", key.short),))] == 0
        assert m[("hotweights_entry_parked_engines", (("key", key.short),))] == 0
        info = [labels for name, labels in m if name == "hotweights_entry_info"]
        assert info and dict(info[0])["model"] == "tiny" and dict(info[0])["key"] == key.short
        assert any(name == "hotweights_info" and dict(labels).get("version") for name, labels in m)
        assert "metrics: http://127.0.0.1:" in d.log()
    finally:
        d.stop()


def test_the_embedded_server_counts_requests_tokens_and_latency(warm_server):
    assert warm_server.post("/v1/completions", {"prompt": "ab", "max_tokens": 4, "temperature": 0})[0] == 200
    assert warm_server.post("/v1/completions", {"prompt": "ab", "max_tokens": 0})[0] == 400
    m = scrape(warm_server.url + "/metrics")
    assert m[("hotweights_server_requests_total", (("endpoint", "/v1/completions"), ("status", "200")))] >= 1
    assert m[("hotweights_server_requests_total", (("endpoint", "/v1/completions"), ("status", "400")))] >= 1
    assert m[("hotweights_server_prompt_tokens_total", ())] >= 2
    assert m[("hotweights_server_generation_tokens_total", ())] >= 1
    assert m[("hotweights_server_time_to_first_token_seconds_count", ())] >= 1
    assert m[("hotweights_server_e2e_request_latency_seconds_count", ())] >= 1
    for phase in ("imports", "weights", "warmup", "ready"):
        assert m[("hotweights_server_startup_phase_seconds", (("phase", phase),))] >= 0


def test_a_taken_metrics_port_is_one_line_naming_the_address(socket_dir):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("daemon", "--socket-dir", str(socket_dir), "--metrics-port", str(port), timeout=60)
    assert done.returncode != 0
    assert f"cannot serve /metrics on 127.0.0.1:{port} (Address already in use)" in done.stderr.splitlines()[-1]
