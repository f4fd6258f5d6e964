# The keeper's image (deploy/kubernetes/hotweights-daemonset.yaml names it ghcr.io/hotweights/hotweights:0.1.0):
# Python and the hotweights wheel, base install: the daemon needs neither torch nor CUDA.
#   make wheel && docker build -f deploy/docker/keeper.Dockerfile -t ghcr.io/hotweights/hotweights:0.1.0 .
FROM python:3.12-slim
COPY dist/hotweights-0.1.0-py3-none-any.whl /tmp/
RUN pip install --no-cache-dir /tmp/hotweights-0.1.0-py3-none-any.whl \
    && rm /tmp/hotweights-0.1.0-py3-none-any.whl \
    && useradd --uid 1000 --create-home hotweights
# the uid the engines run as: the daemon serves its own uid only
USER 1000
ENTRYPOINT ["hotweights"]
# --init: PID 1 stays across `hotweights daemon --replace` (an in-place upgrade keeps the entries)
CMD ["daemon", "--init", "--socket-dir", "/run/hotweights"]
