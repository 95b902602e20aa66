# rsinfer developer and operator targets. `make serve` and `make test` are the two set-up commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= config.example.yaml
PIP := $(BIN)/python -m pip

.PHONY: install dev test lint serve completions man docs-ref docs docs-serve proto docs-assets cpu gpu-cuda gpu-trt mac-coreml openvino openvino-venv clients-venv clean
OV_VENV ?= .venv-openvino
CLIENTS_VENV ?= .venv-clients
# the client libraries docs/clients.md shows against rsinfer, at the versions its snippets are run with in the suite
# (their own venv: kserve pins protobuf < 7 and several pull web frameworks rsinfer does not use)
CLIENT_LIBS := kserve==0.21.0 litellm==1.110.2 langchain-openai==1.8.1 llama-index-embeddings-openai==0.7.0 \
	haystack-ai==3.4.1 chromadb==1.5.9

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

install: $(BIN)/rsinfer       ## rsinfer with the CPU onnxruntime wheel (again only when pyproject.toml changes)

# a file target: `make serve` installs once, then starts with no package index (an air-gapped host, a restart)
$(BIN)/rsinfer: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e .
	@touch $@

dev: $(BIN)/python            ## rsinfer plus the test tools
	$(PIP) install -q -e '.[test]'

test: dev                     ## lint, type-check the package (mypy --strict), then the whole suite (no network; ../shared/models)
	-@$(MAKE) --no-print-directory openvino-venv   # where the wheel exists (x86_64); tests/test_openvino.py skips without
	-@$(MAKE) --no-print-directory clients-venv    # docs/clients.md's snippets; skipped without
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	RSINFER_OPENVINO_PYTHON="$${RSINFER_OPENVINO_PYTHON:-$(abspath $(OV_VENV))/bin/python}" \
	RSINFER_CLIENTS_PYTHON="$${RSINFER_CLIENTS_PYTHON:-$(abspath $(CLIENTS_VENV))/bin/python}" $(BIN)/pytest

clients-venv: $(CLIENTS_VENV)/bin/python   ## a venv of the client libraries docs/clients.md runs (llama-index, litellm, ...)

$(CLIENTS_VENV)/bin/python:      # made once; after a change of CLIENT_LIBS: rm -r .venv-clients
	$(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/python -m pip install -q $(CLIENT_LIBS)
	@touch $@

openvino-venv: $(OV_VENV)/bin/rsinfer   ## a second venv where onnxruntime-openvino replaces onnxruntime (OpenVINO tests)

$(OV_VENV)/bin/rsinfer: pyproject.toml
	$(PYTHON) -m venv $(OV_VENV)
	$(OV_VENV)/bin/python -m pip install -q -e .
	$(OV_VENV)/bin/python -m pip uninstall -q -y $(ORT_WHEELS)
	$(OV_VENV)/bin/python -m pip install -q onnxruntime-openvino

lint: dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

serve: install                ## start the daemon on $(CONFIG) (models are pulled from the Hub on first start)
	$(BIN)/rsinfer serve --config $(CONFIG)

completions man docs-ref: dev ## regenerate completions/, man/ and docs/reference/ from the code (a test diffs them)
	$(BIN)/python -m rsinfer_cli.cli.docgen .

docs: dev                     ## build the docs site into site/ (mkdocs build --strict; the suite runs it too)
	$(BIN)/mkdocs build --strict

docs-serve: dev               ## the docs site on http://127.0.0.1:8000, rebuilt on every edit
	$(BIN)/mkdocs serve -a 127.0.0.1:8000

KSERVE := src/rsinfer_cli/server/kserve
proto: dev                    ## regenerate the committed KServe v2 gRPC modules from $(KSERVE)/kserve.proto
	$(PIP) install -q grpcio-tools
	$(BIN)/python -m grpc_tools.protoc -I $(KSERVE) --python_out=$(KSERVE) --pyi_out=$(KSERVE) \
		--grpc_python_out=$(KSERVE) kserve.proto
	# a private descriptor pool: tritonclient registers the same `inference.*` names in the default one
	sed -i 's/_descriptor_pool.Default().AddSerializedFile(/_POOL.AddSerializedFile(/; s/^_sym_db = /_POOL = _descriptor_pool.DescriptorPool()\n_sym_db = /' \
		$(KSERVE)/kserve_pb2.py
	sed -i 's/^import kserve_pb2 as/from . import kserve_pb2 as/' $(KSERVE)/kserve_pb2_grpc.py

# /docs serves Swagger UI from files inside the package (air-gapped users: no CDN). They came from npm's official
# dist package (Apache-2.0, LICENSE and NOTICE beside them); this refreshes them.
SWAGGER_UI ?= 5.35.0
docs-assets:                  ## refresh src/rsinfer_cli/server/static/swagger-ui from swagger-ui-dist@$(SWAGGER_UI)
	cd /tmp && npm pack swagger-ui-dist@$(SWAGGER_UI) && tar xzf swagger-ui-dist-$(SWAGGER_UI).tgz
	cp /tmp/package/swagger-ui-bundle.js /tmp/package/swagger-ui.css /tmp/package/LICENSE /tmp/package/NOTICE \
		/tmp/package/swagger-ui-bundle.js.LICENSE.txt src/rsinfer_cli/server/static/swagger-ui/

# Execution-provider profiles: which onnxruntime wheel is installed decides which EPs exist
# (the Python counterpart of rs-infer's compile-time features). They all provide the `onnxruntime`
# module, so each profile removes the others first; a later plain `pip install -e .` restores the CPU wheel.
ORT_WHEELS := onnxruntime onnxruntime-gpu onnxruntime-openvino onnxruntime-directml

cpu: install                  ## CPU only (also what macOS gets with CoreML included)
	$(PIP) uninstall -q -y $(ORT_WHEELS)
	$(PIP) install -q onnxruntime

mac-coreml: cpu               ## macOS: the standard wheel carries the CoreML EP (eps: [coreml, cpu])

gpu-cuda: install             ## NVIDIA CUDA 12 + cuDNN 9 from PyPI (eps: [cuda, cpu])
	$(PIP) uninstall -q -y $(ORT_WHEELS)
	$(PIP) install -q 'onnxruntime-gpu[cuda,cudnn]'

gpu-trt: gpu-cuda             ## TensorRT on top of CUDA (eps: [tensorrt, cuda, cpu])
	$(PIP) install -q tensorrt

openvino: install             ## Intel OpenVINO (eps: [openvino, cpu])
	$(PIP) uninstall -q -y $(ORT_WHEELS)
	$(PIP) install -q onnxruntime-openvino

clean:
	rm -rf $(VENV) $(OV_VENV) build dist .pytest_cache .ruff_cache src/*.egg-info
