"""The Hugging Face Inference API shapes: `POST /models/{name}` answers the task of that model's kind, so
`huggingface_hub.InferenceClient(model="http://host:port/models/NAME")` works unmodified. `POST /` does the same for
the one model of a single-model config (TEI's rule).

    embedding  feature-extraction   {"inputs": str | [str], "normalize", "truncate", "truncation_direction",
                                     "prompt_name"} → nested float lists
               sentence-similarity  {"inputs": {"source_sentence", "sentences"}} → cosine scores
    rerank     sentence-similarity  {"inputs": {"source_sentence", "sentences"}} → relevance scores (query, docs)
    pii        token-classification {"inputs": str, "parameters": {"ignore_labels", …}} → [{entity_group, score,
                                     word, start, end}] (spans are whole-word groups: aggregation "simple")
    zeroshot   zero-shot-classification {"inputs": str, "parameters": {"candidate_labels", "multi_label",
                                     "hypothesis_template"}} → [{label, score}] best first
"""

from __future__ import annotations

from aiohttp import web

from ...errors import InputError
from ...pipelines.embedding import EmbeddingPipeline
from ...pipelines.pii import PiiPipeline
from ...pipelines.rerank import RerankPipeline
from ...pipelines.zeroshot import ZeroShotPipeline
from ..errors import RequestValidationError
from ..request import text_or_token_input
from ..schemas import HfRequest, SentencePair
from ..state import STATE
from .common import Call, check_chars, check_count, decode, json_response, truncation_headers
from .embedding import similarity
from .rerank import check_documents
from .zeroshot import check_labels, check_template

routes = web.RouteTableDef()


async def _answer(request: web.Request, name: str) -> web.Response:
    state = request.app[STATE]
    if name not in state.registry.entries:
        from ...errors import ModelNotFound

        raise ModelNotFound(f"model '{name}' not found", param="model", model=name)
    kind = state.registry.entries[name][0].kind
    model = state.registry.get(name, kind)
    call = Call(state, decode(await request.read(), HfRequest), model)
    req = call.req
    inputs = req.inputs
    params = req.parameters or {}
    if kind == "embedding":
        if isinstance(inputs, SentencePair):  # sentence-similarity
            return await similarity(call, inputs)
        pipe = call.pipeline(EmbeddingPipeline)
        texts, ids, _ = text_or_token_input(inputs, "inputs")
        check_count(call, "inputs", len(texts or ids or []))
        check_chars(call, "inputs", texts)
        direction = str(req.truncation_direction or params.get("truncation_direction") or "right")
        normalize = req.normalize if req.normalize is not None else params.get("normalize")
        truncate = req.truncate if req.truncate is not None else params.get("truncate")
        res = await call.infer(pipe.plan, texts, ids, normalize=normalize if isinstance(normalize, bool) else None,
                               truncate=truncate if isinstance(truncate, bool) else None,
                               direction=direction.lower(), param="inputs")
        return json_response(res.vectors, truncation_headers(res.truncated))
    if kind == "rerank":
        if not isinstance(inputs, SentencePair):
            raise RequestValidationError("a rerank model answers sentence-similarity: `inputs` must be "
                                         "{\"source_sentence\", \"sentences\"}", param="inputs")
        source, sentences = inputs.source_sentence, inputs.sentences
        check_documents(len(sentences), "inputs.sentences", state.config.server.max_rerank_documents)
        check_chars(call, "inputs", [source, *sentences])
        scores = await call.infer(call.pipeline(RerankPipeline).plan_rerank, source, sentences)
        return json_response([float(s) for s in scores.scores], truncation_headers(scores.truncated))
    if not isinstance(inputs, str):
        raise RequestValidationError("`inputs` must be a string", param="inputs")
    check_chars(call, "inputs", inputs)
    if kind == "pii":
        pipe_p = call.pipeline(PiiPipeline)
        ignore = params.get("ignore_labels")
        types = None
        if isinstance(ignore, list):
            types = [t for t in pipe_p.types if t not in ignore and f"B-{t}" not in ignore and f"I-{t}" not in ignore]
        det = await call.infer(pipe_p.plan_detect, [inputs], None, types)
        return json_response([{"entity_group": e.entity_type, "score": e.score, "word": e.text, "start": e.start,
                               "end": e.end} for e in det.entities[0]])
    if kind == "zeroshot":
        labels = params.get("candidate_labels")
        if isinstance(labels, str):
            labels = [x.strip() for x in labels.split(",") if x.strip()]
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise RequestValidationError("`parameters.candidate_labels` must be an array of labels",
                                         param="parameters.candidate_labels")
        check_labels(labels, "parameters.candidate_labels", state.config.server.max_candidate_labels)
        template = params.get("hypothesis_template")
        if template is not None and not isinstance(template, str):
            raise RequestValidationError("`parameters.hypothesis_template` must be a string",
                                         param="parameters.hypothesis_template")
        check_template(template, "parameters.hypothesis_template")
        res = await call.infer(call.pipeline(ZeroShotPipeline).plan_classify, [inputs], labels,
                               bool(params.get("multi_label", False)), template)
        r = res.results[0]
        return json_response([{"label": label, "score": s} for label, s in zip(r.labels, r.scores, strict=True)])
    raise InputError(f"model '{name}' is a {kind} model; the Hugging Face task routes serve embedding, rerank, pii "
                     "and zeroshot models", param="model")


@routes.post("/models/{name}")
async def hf_model(request: web.Request) -> web.Response:
    return await _answer(request, request.match_info["name"])


@routes.post("/")
async def hf_root(request: web.Request) -> web.Response:
    """The one model of a single-model config; with several, say where to go."""
    entries = request.app[STATE].registry.entries
    if len(entries) != 1:
        raise InputError(f"several models are served ({', '.join(entries)}): POST to /models/{{name}}",
                         param="model")
    return await _answer(request, next(iter(entries)))
