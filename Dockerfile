# rsinfer in a container: a build stage makes the venv, the final stage carries only the venv.
#   docker build -t rsinfer .
#   docker build -t rsinfer --build-arg MODEL=Xenova/all-MiniLM-L6-v2 .      # a model baked in and served
#     (as MODEL_NAME, default "default"; the image's config then serves that folder alone, HTTP 8080, gRPC 8001)
#   docker run -p 8080:8080 -v $PWD/config.yaml:/etc/rsinfer/config.yaml:ro rsinfer
ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS build
WORKDIR /src
RUN python -m venv /opt/rsinfer
COPY pyproject.toml README.md ./
COPY src ./src
COPY completions ./completions
COPY man ./man
RUN /opt/rsinfer/bin/pip install --no-cache-dir .
# optional: `rsinfer download` a Hub model into the image (air-gapped at run time) and a config that serves it;
# without MODEL the image's config is config.example.yaml
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG MODEL=""
ARG MODEL_NAME=default
COPY config.example.yaml ./
RUN mkdir -p /models /config \
 && if [ -n "$MODEL" ]; then \
      kind=$(/opt/rsinfer/bin/rsinfer download "$MODEL" /models/default --json \
             | /opt/rsinfer/bin/python -c 'import json, sys; print(json.load(sys.stdin)["kind"])') \
      && printf 'server:\n  grpc_bind: 127.0.0.1:8001\nmodels:\n  - name: %s\n    kind: %s\n    path: /models/default\n' \
           "$MODEL_NAME" "$kind" > /config/config.yaml; \
    else cp config.example.yaml /config/config.yaml; fi

FROM python:${PYTHON}-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/rsinfer --create-home rsinfer
COPY --from=build /opt/rsinfer /opt/rsinfer
COPY --from=build --chown=rsinfer:rsinfer /models /models
COPY --from=build /config/config.yaml /etc/rsinfer/config.yaml
ENV PATH=/opt/rsinfer/bin:$PATH \
    HF_HOME=/var/lib/rsinfer/hf-home \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /var/lib/rsinfer
EXPOSE 8080 8001
STOPSIGNAL SIGTERM
# listen on all interfaces inside the container (the default is loopback only)
ENTRYPOINT ["rsinfer", "serve", "--config", "/etc/rsinfer/config.yaml", "--host", "0.0.0.0"]
