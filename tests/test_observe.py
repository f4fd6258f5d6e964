"""``hotweights observe`` (``observe.py``): it polls where the command's server listens, says what it
polls, stops waiting when the command exits, and its receipt says why a start was not ready.

Run: pytest tests/test_observe.py
"""

from __future__ import annotations

import json
import sys

from conftest import free_port, run_cli

from hotweights.observe import health_url_for

SERVER = '''
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def test_the_health_url_follows_the_commands_port_and_host():
    assert health_url_for(["vllm", "serve", "m", "--port", "8021"]) == "http://127.0.0.1:8021/health"
    assert health_url_for(["hotweights", "serve", "m", "--port=9", "--host", "0.0.0.0"]) == \
        "http://127.0.0.1:9/health"
    assert health_url_for(["srv", "--host", "10.1.2.3"]) == "http://10.1.2.3:8000/health"


def test_a_server_on_another_port_is_found_without_a_health_url(tmp_path):
    port = free_port()
    r = run_cli("observe", "s", "--out", str(tmp_path), "--interval", "0.1", "--timeout", "30", "--exit-when-ready",
                "--", sys.executable, "-c", SERVER, "--port", str(port), timeout=60)
    receipt = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and receipt["ready"], r.stderr
    assert f"waiting for http://127.0.0.1:{port}/health" in r.stderr
    assert receipt["health_url"] == f"http://127.0.0.1:{port}/health" and receipt["reason"] == ""


def test_a_command_that_exits_ends_the_wait_and_the_receipt_says_why(tmp_path):
    port = free_port()
    r = run_cli("observe", "dead", "--out", str(tmp_path), "--interval", "0.1", "--", sys.executable, "-c",
                "raise SystemExit(3)", "--port", str(port), timeout=60)
    receipt = json.loads((tmp_path / "dead.json").read_text())
    assert r.returncode == 1 and receipt["exit_code"] == 3
    assert receipt["reason"].startswith(f"the command exited with code 3 before http://127.0.0.1:{port}/health")
    assert receipt["reason"] in r.stderr
