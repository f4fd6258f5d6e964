"""The cluster's OpenAI ingress, a Ray Serve deployment behind Ray's HTTP proxy: it reads a request's ``model`` (or an
alias) as one front does (``switch.port.validate``), and sends the request to the node deployment with that model as the
multiplexed model id, where the router (``router.py``) picks the node; the node's answer comes back as it streams.

Faults: a node that dies before its answer began (its replica gone, or its front not answering) is tried again on
another node, up to ``RETRIES`` times; one that dies in the middle of a stream ends it with an error event and
``[DONE]``, as one front ends a stream whose engine died (vLLM's shape).

Not covered: the front's own routes (``/switch/*``, ``/metrics``, the status page) are each node's, on its loopback.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from .. import __version__
from ..openai_errors import error_response as error
from ..openai_errors import stream_error
from ..switch.port.validate import RELAYED, Refused, model_of
from .config import parse

logger = logging.getLogger("hotweights.cluster")
RETRIES = 2
NODE_HEADER = "x-hotweights-node"  # the Ray node id of the node that answered


class Ingress:
    def __init__(self, nodes: DeploymentHandle[Any], config_text: str, config_name: str = "cluster.toml") -> None:
        self.nodes = nodes
        self.cluster = parse(config_text, Path(config_name))
        self.routes = self.cluster.routes
        self.key = self.cluster.api_key

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if path == "/health":
            return Response(status_code=200)
        if path == "/version":
            return JSONResponse({"version": __version__})
        if self.key and request.headers.get("authorization", "") != f"Bearer {self.key}":
            return error(401, "Unauthorized")
        if path == "/v1/models" and request.method == "GET":
            return self._models()
        if path in RELAYED and request.method == "POST":
            return await self._forward(path, await request.body())
        return error(404, f"Not Found: {request.method} {path}", kind="Not Found")

    def _models(self) -> Response:
        now = int(time.time())
        return JSONResponse({"object": "list", "data": [
            {"id": asked, "object": "model", "created": now, "owned_by": "hotweights",
             "parent": None if asked == name else name, "permission": []} for asked, name in self.routes.items()]})

    async def _forward(self, path: str, body: bytes) -> Response:
        try:
            asked = model_of(path, body, self.routes, self.cluster.default.name)
        except Refused as exc:
            return error(exc.status, str(exc), exc.param)
        name = self.routes[asked]
        fields = json.loads(body)  # a JSON object: model_of checked it
        if asked != name:  # an alias: the node's front knows both, its engine is asked by the name
            body = json.dumps({**fields, "model": name}).encode()
        if not fields.get("stream"):
            return await self._whole(path, body, name)
        problem = ""
        for attempt in range(1 + RETRIES):
            stream = cast(DeploymentResponseGenerator[Any], self.nodes.options(
                stream=True, multiplexed_model_id=name).relay.remote(path, body))
            try:
                head = await stream.__anext__()
            except StopAsyncIteration:
                return error(502, f"the node for `{name}` answered nothing")
            except Exception as exc:  # nothing sent to the client yet: another node may serve it
                problem = _gone_before(name, exc, attempt)
                continue
            events = head["headers"].get("content-type", "").startswith("text/event-stream")
            headers = {**head["headers"], NODE_HEADER: head["node"]}  # which node served it: for the curious, and tests
            return StreamingResponse(self._rest(head["first"], stream, name, events), status_code=head["status"],
                                     headers=headers)
        return error(503, f"no node answered for `{name}` ({problem})")

    async def _whole(self, path: str, body: bytes, name: str) -> Response:
        """An answer that is not streamed: one call to a node, tried again on another where the first went away."""
        problem = ""
        for attempt in range(1 + RETRIES):
            try:
                status, headers, content, node = await self.nodes.options(multiplexed_model_id=name).answer.remote(
                    path, body)
            except Exception as exc:  # a node gone (Ray says so several ways): another may serve it
                problem = _gone_before(name, exc, attempt)
                continue
            return Response(content, status_code=status, headers={**headers, NODE_HEADER: node})
        return error(503, f"no node answered for `{name}` ({problem})")

    async def _rest(self, first: bytes, stream: Any, name: str, events: bool) -> AsyncIterator[bytes]:
        tail = (b"\n\n" + first)[-2:]
        if first:
            yield first
        try:
            async for chunk in stream:
                tail = (tail + chunk)[-2:]
                yield chunk
        except Exception as exc:  # a node's death reaches a stream as several of Ray's errors: each ends it
            logger.warning("cluster: %s: its node went away in the middle of an answer (%s)", name, _said(exc))
            if events:
                yield (b"" if tail == b"\n\n" else b"\n\n") + stream_error(
                    f"the node serving `{name}` went away in the middle of this answer; retry the request", 503)


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _gone_before(name: str, exc: BaseException, attempt: int) -> str:
    """A node that went away before its answer began, logged; the line a final 503 gives."""
    problem = _said(exc)
    logger.warning("cluster: %s: its node went away before answering (%s); %s", name, problem,
                   "trying another" if attempt < RETRIES else "giving up")
    return problem


IngressDeployment = serve.deployment(name="Ingress", ray_actor_options={"num_cpus": 0},
                                     max_ongoing_requests=10_000)(Ingress)
