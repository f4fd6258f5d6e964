"""The embedded server's Prometheus metrics (``GET /metrics``), with ``prometheus-client``.

Where vLLM exposes the same quantity, the vLLM name is given in the help text, so that a dashboard
built for one reads the other: requests by endpoint and status (``vllm:request_success_total`` counts
finished requests by finish reason), prompt and generated tokens (``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``), time to first token (``vllm:time_to_first_token_seconds``) and
end-to-end latency (``vllm:e2e_request_latency_seconds``). The start-up phases of the startup line are
gauges (vLLM has none: its start is in its log).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    def __init__(self) -> None:
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("hotweights_server_requests", "HTTP requests by endpoint and status "
                                "(vLLM: vllm:request_success_total, by finish reason)", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter("hotweights_server_prompt_tokens", "Prompt tokens processed "
                                     "(vLLM: vllm:prompt_tokens_total)", registry=r)
        self.generation_tokens = Counter("hotweights_server_generation_tokens", "Tokens generated "
                                         "(vLLM: vllm:generation_tokens_total)", registry=r)
        self.ttft = Histogram("hotweights_server_time_to_first_token_seconds", "From a request's arrival to its "
                              "first generated text (vLLM: vllm:time_to_first_token_seconds)", buckets=LATENCY,
                              registry=r)
        self.e2e = Histogram("hotweights_server_e2e_request_latency_seconds", "From a request's arrival to its "
                             "last token (vLLM: vllm:e2e_request_latency_seconds)", buckets=LATENCY, registry=r)
        self.startup = Gauge("hotweights_server_startup_phase_seconds", "Seconds of each start-up phase, from "
                             "process start (the startup line)", ["phase"], registry=r)

    def started(self, phases: dict[str, float]) -> None:
        for phase, seconds in phases.items():
            self.startup.labels(phase).set(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
