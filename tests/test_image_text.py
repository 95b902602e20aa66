"""CLIP and SigLIP served (`kind: image_text`): image and text vectors on /v1/embeddings (infinity's `modality`),
the OpenAI SDK and the Hugging Face client, zero-shot image classification on its route and as the Hugging Face
task, all against transformers' references for tiny-clip and tiny-siglip; and the images it refuses with a 400
while it keeps serving."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")
pytestmark = pytest.mark.shared
TOL = 1e-4
NAMES = ("clip", "siglip")


@pytest.fixture(scope="module")
def server(shared_models):
    import httpx

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    cfg = parse_config({"models": [{"name": n, "kind": "image_text", "path": str(shared_models / f"tiny-{n}")}
                                   for n in NAMES]})
    with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        yield srv, c


def _ref(shared_models, name):
    return json.loads((shared_models / f"tiny-{name}" / "reference.json").read_text(encoding="utf-8"))


def _b64(shared_models, name, file):
    return base64.b64encode((shared_models / f"tiny-{name}" / file).read_bytes()).decode("ascii")


@pytest.mark.parametrize("name", NAMES)
def test_image_and_text_vectors_are_transformers(server, shared_models, name):
    _, c = server
    ref = _ref(shared_models, name)
    images = [_b64(shared_models, name, im["file"]) for im in ref["images"]]
    images[1] = "data:image/jpeg;base64," + images[1]                   # a data URI too
    r = c.post("/v1/embeddings", json={"model": name, "input": images, "modality": "image"})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]])
    assert np.abs(got - np.array([im["image_embeds_normalized"] for im in ref["images"]])).max() <= TOL
    texts = [t["text"] for t in ref["texts"]]
    r = c.post("/v1/embeddings", json={"model": name, "input": texts})
    got = np.array([d["embedding"] for d in r.json()["data"]])
    assert np.abs(got - np.array([t["text_embeds_normalized"] for t in ref["texts"]])).max() <= TOL
    raw = c.post(f"/models/{name}/embed", json={"inputs": texts[:2], "normalize": False})
    assert raw.status_code == 200, raw.text
    raw = raw.json()
    assert np.abs(np.array(raw) - np.array([t["text_embeds"] for t in ref["texts"][:2]])).max() <= TOL


@pytest.mark.parametrize("name", NAMES)
def test_zero_shot_is_the_pipelines(server, shared_models, name):
    from huggingface_hub import InferenceClient

    srv, c = server
    ref = _ref(shared_models, name)
    for z in ref["zero_shot"]:
        im = next(x for x in ref["images"] if x["name"] == z["image"])
        body = {"model": name, "image": _b64(shared_models, name, im["file"]), "candidate_labels": z["labels"],
                "hypothesis_template": z["template"]}
        got = c.post("/classify/zero-shot-image", json=body).json()
        assert [x["label"] for x in got] == [x["label"] for x in z["pipeline_output"]], z["labels"]
        assert all(abs(a["score"] - b["score"]) <= TOL for a, b in zip(got, z["pipeline_output"], strict=True))
    z = next(z for z in ref["zero_shot"] if z["template"] == "This is a photo of {}.")
    im = next(x for x in ref["images"] if x["name"] == z["image"])
    client = InferenceClient(model=f"{srv.url}/models/{name}")
    out = client.zero_shot_image_classification((shared_models / f"tiny-{name}" / im["file"]).read_bytes(),
                                                candidate_labels=z["labels"])
    assert [o.label for o in out] == [x["label"] for x in z["pipeline_output"]]
    assert all(abs(o.score - x["score"]) <= TOL for o, x in zip(out, z["pipeline_output"], strict=True))
    vec = client.feature_extraction(ref["texts"][0]["text"])
    assert np.abs(np.asarray(vec).reshape(-1) - ref["texts"][0]["text_embeds_normalized"]).max() <= TOL


def test_the_openai_sdk_sends_images_with_modality(server, shared_models):
    import httpx
    import openai

    srv, _ = server
    ref = _ref(shared_models, "clip")
    with httpx.Client() as http:
        oa = openai.OpenAI(api_key="unused", base_url=srv.url + "/v1", http_client=http)
        out = oa.embeddings.create(model="clip", input=[_b64(shared_models, "clip", ref["images"][0]["file"])],
                                   extra_body={"modality": "image"})
    assert np.abs(np.array(out.data[0].embedding) - ref["images"][0]["image_embeds_normalized"]).max() <= TOL


def _bomb() -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 40_000, 40_000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_bad_images_are_400s_and_the_server_keeps_serving(server, shared_models):
    _, c = server
    png = (shared_models / "tiny-clip" / "images" / "gradient_640x480.png").read_bytes()
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"/>'
    cases = [(base64.b64encode(png[: len(png) // 2]).decode(), "cannot decode the image"),
             (base64.b64encode(_bomb()).decode(), "refused before decoding"),
             (base64.b64encode(svg).decode(), "not an image in a format read here"),
             ("https://example.com/cat.png", "image URLs are off for this model"),
             ("not base64 at all!", "not valid base64")]
    for item, said in cases:
        r = c.post("/v1/embeddings", json={"model": "clip", "input": ["x" and base64.b64encode(png).decode(), item],
                                           "modality": "image"})
        assert r.status_code == 400, (said, r.text)
        assert said in r.json()["error"]["message"] and r.json()["error"]["param"] == "input[1]"
        z = c.post("/classify/zero-shot-image", json={"model": "clip", "image": item, "candidate_labels": ["a"]})
        assert z.status_code == 400 and said in z.json()["error"]["message"]
    text_only = c.post("/classify/zero-shot-image", json={"model": "clip", "image": base64.b64encode(png).decode(),
                                                         "candidate_labels": []})
    assert text_only.status_code == 400 and text_only.json()["error"]["param"] == "candidate_labels"
    ok = c.post("/v1/embeddings", json={"model": "clip", "input": [base64.b64encode(png).decode()],
                                        "modality": "image"})
    assert ok.status_code == 200


def test_a_text_model_refuses_images(shared_models):
    import httpx

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    cfg = parse_config({"models": [{"name": "mini", "kind": "embedding", "path": str(shared_models /
                                                                                     "all-minilm-l6-v2")}]})
    with ServerThread(cfg) as srv:
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": ["aGVsbG8="], "modality": "image"}, timeout=30)
    assert r.status_code == 400 and "embeds text only" in r.json()["error"]["message"]


def test_inspect_and_recognition(shared_models):
    import rsinfer_cli

    with rsinfer_cli.load(shared_models / "tiny-siglip") as model:
        assert model.kind == "image_text"
        d = model.pipeline.describe()
        assert d["family"] == "siglip" and d["resample"] == "bilinear" and d["image_size"] == [224, 224]


@pytest.mark.parametrize(("name", "style"), [("clip", "folded"), ("siglip", "exp_cast")])
def test_zero_shot_of_a_xenova_repo_reads_the_combined_graph(shared_models, tmp_path, name, style):
    """A folder in Xenova's layout (towers, a combined onnx/model.onnx, no model.safetensors) classifies as the
    pipeline does; the only model of its config answers the Hugging Face task on `/`; inspect says where the
    scalars came from."""
    import httpx
    from huggingface_hub import InferenceClient

    import rsinfer_cli
    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread
    from synth import xenova_folder

    folder, ref, _ = xenova_folder(shared_models / f"tiny-{name}", tmp_path / name, style)
    with rsinfer_cli.load(folder) as model:
        assert model.pipeline.describe()["zero_shot"].endswith("(from onnx/model.onnx)")
    cfg = parse_config({"models": [{"name": name, "kind": "image_text", "path": str(folder)}]})
    z = next(z for z in ref["zero_shot"] if z["template"] == "This is a photo of {}.")
    im = next(x for x in ref["images"] if x["name"] == z["image"])
    with ServerThread(cfg) as srv:
        out = InferenceClient(model=srv.url).zero_shot_image_classification((folder / im["file"]).read_bytes(),
                                                                          candidate_labels=z["labels"])
        other = next(z for z in ref["zero_shot"] if z["template"] != "This is a photo of {}.")
        oim = next(x for x in ref["images"] if x["name"] == other["image"])
        got = httpx.post(srv.url + "/classify/zero-shot-image", timeout=60, json={
            "image": _b64(shared_models, name, oim["file"]), "candidate_labels": other["labels"],
            "hypothesis_template": other["template"]}).json()
    assert [o.label for o in out] == [x["label"] for x in z["pipeline_output"]]
    assert all(abs(o.score - x["score"]) <= TOL for o, x in zip(out, z["pipeline_output"], strict=True))
    assert [x["label"] for x in got] == [x["label"] for x in other["pipeline_output"]]
    assert all(abs(a["score"] - b["score"]) <= TOL for a, b in zip(got, other["pipeline_output"], strict=True))


def test_jina_items_vllm_messages_and_cohere_images(server, shared_models):
    import cohere
    import httpx

    srv, c = server
    ref = _ref(shared_models, "siglip")
    im, text = ref["images"][0], ref["texts"][0]
    b64 = _b64(shared_models, "siglip", im["file"])
    uri = "data:image/png;base64," + b64
    r = c.post("/v1/embeddings", json={"model": "siglip", "input": [{"text": text["text"]}, {"image": b64}]})
    assert r.status_code == 200, r.text
    got = [d["embedding"] for d in r.json()["data"]]
    assert np.abs(np.array(got[0]) - text["text_embeds_normalized"]).max() <= TOL
    assert np.abs(np.array(got[1]) - im["image_embeds_normalized"]).max() <= TOL
    for content, want in (([{"type": "image_url", "image_url": {"url": uri}}], im["image_embeds_normalized"]),
                          (text["text"], text["text_embeds_normalized"])):
        r = c.post("/v1/embeddings", json={"model": "siglip", "messages": [{"role": "user", "content": content}]})
        assert r.status_code == 200, r.text
        assert np.abs(np.array(r.json()["data"][0]["embedding"]) - want).max() <= TOL
    two = c.post("/v1/embeddings", json={"model": "siglip", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": uri}}]}]})
    assert two.status_code == 400 and "2 content parts" in two.json()["error"]["message"]
    with httpx.Client() as http:
        co = cohere.ClientV2(api_key="unused", base_url=srv.url, httpx_client=http)
        out = co.embed(model="siglip", input_type="image", embedding_types=["float"], images=[uri])
        assert np.abs(np.array(out.embeddings.float_[0]) - im["image_embeds_normalized"]).max() <= TOL
    mixed = c.post("/v2/embed", json={"model": "siglip", "input_type": "search_document", "embedding_types": ["float"],
                                      "inputs": [{"content": [{"type": "text", "text": text["text"]}]},
                                                 {"content": [{"type": "image_url", "image_url": {"url": uri}}]}]})
    assert mixed.status_code == 200, mixed.text
    vecs = mixed.json()["embeddings"]["float"]
    assert np.abs(np.array(vecs[0]) - text["text_embeds_normalized"]).max() <= TOL
    assert np.abs(np.array(vecs[1]) - im["image_embeds_normalized"]).max() <= TOL


@pytest.mark.parametrize("name", NAMES)
def test_the_api_and_the_cli(shared_models, name, tmp_path):
    import subprocess
    import sys

    import rsinfer_cli

    folder = shared_models / f"tiny-{name}"
    ref = _ref(shared_models, name)
    files = [folder / im["file"] for im in ref["images"]]
    with rsinfer_cli.load(folder) as model:
        got = model.embed_images(files)
        assert np.abs(got - np.array([im["image_embeds_normalized"] for im in ref["images"]])).max() <= TOL
        raw = model.embed_images([files[0].read_bytes()], normalize=False)
        assert np.abs(raw[0] - ref["images"][0]["image_embeds"]).max() <= TOL
        z = ref["zero_shot"][0]
        im = next(x for x in ref["images"] if x["name"] == z["image"])
        ranked = model.classify_image([folder / im["file"]], z["labels"], template=z["template"])[0]
        assert [lb.label for lb in ranked] == [x["label"] for x in z["pipeline_output"]]
        assert all(abs(lb.score - x["score"]) <= TOL for lb, x in zip(ranked, z["pipeline_output"], strict=True))
    out = subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed-images", "--path", str(folder),
                          str(folder / "images")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    by_file = {Path(x["image"]).name: x["embedding"] for x in map(json.loads, out.stdout.splitlines())}
    for each in ref["images"]:
        assert np.abs(np.array(by_file[Path(each["file"]).name]) - each["image_embeds_normalized"]).max() <= TOL
    same = subprocess.run([sys.executable, "-m", "rsinfer_cli", "embed", "--path", str(folder), "--images",
                           str(files[0])], capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stderr
    assert np.abs(np.array(json.loads(same.stdout)["embedding"]) - ref["images"][0]["image_embeds_normalized"]).max() \
        <= TOL
    zs = subprocess.run([sys.executable, "-m", "rsinfer_cli", "classify-image", "--path", str(folder), "--labels",
                         ",".join(z["labels"]), "--template", z["template"], str(folder / im["file"])],
                        capture_output=True, text=True, timeout=120)
    assert zs.returncode == 0, zs.stderr
    line = json.loads(zs.stdout)
    assert line["labels"] == [x["label"] for x in z["pipeline_output"]]
    bad = subprocess.run([sys.executable, "-m", "rsinfer_cli", "classify-image", "--path", str(folder), "--labels",
                          "a", str(tmp_path / "none.png")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no such file or folder" in bad.stderr


def test_image_urls_only_from_allowed_hosts_within_limits(shared_models):
    """image_url_hosts lets a model fetch http(s) images from those hosts only: no redirect, at most
    max_image_bytes, within image_url_timeout_s; each refusal a 400 in bounded time."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    png = (shared_models / "tiny-clip" / "images" / "gradient_640x480.png").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/slow.png":
                time.sleep(3)
            if self.path == "/moved.png":
                self.send_response(302)
                self.send_header("Location", "http://example.com/x.png")
                self.end_headers()
                return
            body = png * 40 if self.path == "/big.png" else png
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    host = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{host.server_address[1]}"
    ref = _ref(shared_models, "clip")
    want = next(im for im in ref["images"] if im["file"].endswith("gradient_640x480.png"))
    cfg = parse_config({"models": [{"name": "clip", "kind": "image_text", "path": str(shared_models / "tiny-clip"),
                                    "image_url_hosts": ["127.0.0.1"], "image_url_timeout_s": 1,
                                    "max_image_bytes": 200_000}]})
    try:
        with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
            ok = c.post("/v1/embeddings", json={"model": "clip", "modality": "image", "input": [f"{base}/a.png"]})
            assert ok.status_code == 200, ok.text
            assert np.abs(np.array(ok.json()["data"][0]["embedding"]) - want["image_embeds_normalized"]).max() <= TOL
            for url, said in ((f"http://localhost:{host.server_address[1]}/a.png", "is not in the model's "
                               "image_url_hosts"),
                              (f"{base}/moved.png", "a redirect is not followed"),
                              (f"{base}/big.png", "more than 200000 bytes"),
                              (f"{base}/slow.png", "fetching the image URL failed"),
                              ("ftp://127.0.0.1/a.png", "not valid base64")):
                t0 = time.monotonic()
                r = c.post("/v1/embeddings", json={"model": "clip", "modality": "image", "input": [url]})
                assert r.status_code == 400 and said in r.json()["error"]["message"], (url, r.text)
                assert time.monotonic() - t0 < 30
    finally:
        host.shutdown()
        host.server_close()


def test_a_repo_downloads_and_caches_image_rows(shared_models, fake_hub, tmp_path):
    """A Hub repo in Xenova's layout loads (vision tower main, text tower beside it), `rsinfer download` keeps
    both towers and preprocessor_config.json, and the row cache answers an image it saw by its bytes' digest."""
    import subprocess
    import sys

    import httpx

    from rsinfer_cli.config import parse_config

    from serverutil import ServerThread

    src = shared_models / "tiny-siglip"
    files = {str(f.relative_to(src)): f.read_bytes() for f in src.rglob("*")
             if f.is_file() and not f.name.startswith("reference") and "images" not in f.parts}
    fake_hub.add("Xenova/tiny-siglip", files)
    dest = tmp_path / "dl"
    proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "download", "Xenova/tiny-siglip", str(dest)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in dest.rglob("*.onnx")} == {"vision_model.onnx", "text_model.onnx"}
    assert (dest / "preprocessor_config.json").is_file() or any(dest.rglob("preprocessor_config.json"))
    cfg = parse_config({"server": {"cache": {"backend": "memory"}},
                        "models": [{"name": "sig", "kind": "image_text", "hf": "Xenova/tiny-siglip"}]})
    image = _b64(shared_models, "siglip", "images/gradient_640x480.png")
    with ServerThread(cfg) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        first = c.post("/v1/embeddings", json={"modality": "image", "input": [image]})
        second = c.post("/v1/embeddings", json={"modality": "image", "input": [image]})
    assert (first.headers["x-rsinfer-cache"], second.headers["x-rsinfer-cache"]) == ("miss", "hit")
    assert first.json()["data"] == second.json()["data"]


def test_a_xenova_repo_with_a_combined_graph_and_precisions(shared_models, fake_hub, tmp_path, monkeypatch):
    """A repo as Xenova ships CLIP: onnx/model.onnx (the combined graph) beside vision_ and text_model in two
    precisions, no model.safetensors. `download` takes the towers, never the combined graph as the model or whole:
    its nodes and small constants are read by byte ranges (kept as model.onnx.constants.json), so zero-shot works
    from the Hub and offline; `--dtype int8` takes both towers quantized."""
    import subprocess
    import sys

    import httpx

    import rsinfer_cli
    from rsinfer_cli.config import parse_config
    from rsinfer_cli.engine.model import load_model
    from rsinfer_cli.hub import ModelSource, layout_graph, paired_graph, resolve

    from serverutil import ServerThread
    from synth import combined_tail

    src = shared_models / "tiny-siglip"
    ref = _ref(shared_models, "siglip")
    files = {str(f.relative_to(src)): f.read_bytes() for f in src.rglob("*") if f.is_file()
             and f.name != "model.safetensors" and not f.name.startswith("reference") and "images" not in f.parts}
    for tower in ("vision_model", "text_model"):
        files[f"onnx/{tower}_quantized.onnx"] = files[f"onnx/{tower}.onnx"]
    combined_tail(tmp_path / "combined.onnx", "siglip", ref["settings"]["logit_scale"],
                  ref["settings"]["logit_bias"], "exp_cast")
    files["onnx/model.onnx"] = (tmp_path / "combined.onnx").read_bytes()
    fake_hub.add("Xenova/tiny-siglip-q", files)
    assert layout_graph(frozenset(files)) == "vision_model.onnx"
    assert paired_graph("onnx/vision_model_quantized.onnx", "vision_model.onnx", "text_model.onnx") == \
        "text_model_quantized.onnx"
    assert paired_graph("onnx/custom.onnx", "vision_model.onnx", "text_model.onnx") == "text_model.onnx"
    for dtype, want in (("auto", {"vision_model.onnx", "text_model.onnx"}),
                        ("int8", {"vision_model_quantized.onnx", "text_model_quantized.onnx"})):
        dest = tmp_path / dtype
        proc = subprocess.run([sys.executable, "-m", "rsinfer_cli", "download", "Xenova/tiny-siglip-q", str(dest),
                               "--dtype", dtype], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert {p.name for p in dest.rglob("*.onnx")} == want, dtype
        assert (dest / "model.onnx.constants.json").is_file()
    whole = [r for r in fake_hub.requests if r[0] == "GET" and r[1].endswith("onnx/model.onnx")]
    assert len(whole) == len([r for r in fake_hub.ranges if r[0] == "onnx/model.onnx"]) > 0   # ranges only, once
    resolved = resolve(ModelSource(path=str(src), dtype="int8", prefer="vision_model.onnx"))
    assert resolved.graph_file == "onnx/vision_model.onnx"     # no quantized pair there: the plain one
    cfg = parse_config({"models": [{"name": "q", "kind": "image_text", "hf": "Xenova/tiny-siglip-q",
                                    "dtype": "int8"}]}).models[0]
    model = load_model(cfg)
    assert model.resolved.graph_file == "onnx/vision_model_quantized.onnx"
    assert model.towers["text_model.onnx"].file == "text_model_quantized.onnx"
    with rsinfer_cli.load(tmp_path / "auto") as m:
        assert m.pipeline.describe()["zero_shot"].endswith("(from model.onnx.constants.json)")
    z = ref["zero_shot"][0]
    im = next(x for x in ref["images"] if x["name"] == z["image"])
    body = {"model": "sig", "image": _b64(shared_models, "siglip", im["file"]), "candidate_labels": z["labels"],
            "hypothesis_template": z["template"]}
    fake_hub.stop()                                     # the Hub gone: the cache answers, constants included
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = parse_config({"models": [{"name": "sig", "kind": "image_text", "hf": "Xenova/tiny-siglip-q"}]})
    with ServerThread(cfg) as srv:
        r = httpx.post(srv.url + "/classify/zero-shot-image", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert [x["label"] for x in got] == [x["label"] for x in z["pipeline_output"]]
    assert all(abs(a["score"] - b["score"]) <= TOL for a, b in zip(got, z["pipeline_output"], strict=True))
