# An engine image: vLLM's own with the hotweights wheel in its environment, which registers
# --load-format hotweights and gives `hotweights vllm serve` (deploy/kubernetes/vllm-deployment.yaml).
#   make wheel && docker build -f deploy/docker/engine.Dockerfile -t ghcr.io/hotweights/vllm-openai:v0.26.0-hw0.1.0 .
FROM vllm/vllm-openai:v0.26.0
COPY dist/hotweights-0.1.0-py3-none-any.whl /tmp/
RUN pip install --no-cache-dir /tmp/hotweights-0.1.0-py3-none-any.whl \
    && rm /tmp/hotweights-0.1.0-py3-none-any.whl
# the keeper's uid (the daemon serves its own uid only)
USER 1000
ENTRYPOINT ["hotweights", "vllm"]
CMD ["serve", "--help"]
