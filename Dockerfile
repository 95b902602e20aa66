# rsinfer in a container: a build stage makes the venv, the final stage carries only the venv.
#   docker build -t rsinfer .
#   docker build -t rsinfer --build-arg MODEL=Xenova/all-MiniLM-L6-v2 .      # a model baked in at build time
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
# optional: `rsinfer download` a Hub model into the image (air-gapped at run time)
ARG MODEL=""
RUN if [ -n "$MODEL" ]; then /opt/rsinfer/bin/rsinfer download "$MODEL" /models/default; else mkdir -p /models; fi

FROM python:${PYTHON}-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/rsinfer --create-home rsinfer
COPY --from=build /opt/rsinfer /opt/rsinfer
COPY --from=build --chown=rsinfer:rsinfer /models /models
COPY config.example.yaml /etc/rsinfer/config.yaml
ENV PATH=/opt/rsinfer/bin:$PATH \
    HF_HOME=/var/lib/rsinfer/hf-home \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /var/lib/rsinfer
EXPOSE 8080 8001
STOPSIGNAL SIGTERM
# listen on all interfaces inside the container (the default is loopback only)
ENTRYPOINT ["rsinfer", "serve", "--config", "/etc/rsinfer/config.yaml", "--host", "0.0.0.0"]
