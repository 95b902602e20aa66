"""rsinfer_cli.ray on a real local Ray cluster (2 CPUs, every server on loopback): the classes embed, sparse-encode
and redact a 2,000-row dataset as the API does, an actor killed mid-job still leaves every row exactly once, and
the batch formats and error policy hold."""

from __future__ import annotations

import os

import numpy as np
import pytest

import rsinfer_cli
from bulkdata import ROWS, api_answers, texts

# a one-node cluster whose servers (GCS, raylet, workers) listen on loopback only: read when ray is imported
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
pytest.importorskip("ray.data", reason="the ray extra is not installed (pip install 'rsinfer[ray]')")
import ray  # noqa: E402
import ray.data  # noqa: E402

import rsinfer_cli.ray as rr  # noqa: E402

KILLED_ROWS = 600       # the kill test: Ray Data's recovery is what it shows, not throughput
# Ray's own modules warn of their deprecated settings (DataContext) on import: not this project's to fix
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             _temp_dir=str(tmp_path_factory.mktemp("ray")))
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield ray
    finally:
        ray.shutdown()


def dataset(n: int = ROWS):
    return ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts(n))])


def by_id(rows: list[dict]) -> list[dict]:
    ids = [r["id"] for r in rows]
    assert sorted(ids) == list(range(len(rows))), "a row was lost or duplicated"
    return sorted(rows, key=lambda r: r["id"])


def test_embed_sparse_and_redact_as_the_api(cluster, shared_models):
    ds = dataset()
    emb = by_id(ds.map_batches(rr.Embed, fn_constructor_kwargs={"path": str(shared_models / "all-minilm-l6-v2")},
                               concurrency=2, num_cpus=1, batch_size=256, batch_format="pyarrow").take_all())
    want = api_answers(shared_models)["embed"]
    np.testing.assert_allclose(np.stack([r["embedding"] for r in emb]), want, rtol=0, atol=2e-6)

    sp = by_id(ds.map_batches(rr.Sparse, fn_constructor_kwargs={"path": str(shared_models / "tiny-splade"),
                                                                "top_k": 16},
                              concurrency=1, num_cpus=2, batch_size=500, batch_format="pyarrow").take_all())
    sparse = api_answers(shared_models)["sparse"]
    assert [[x["index"] for x in r["sparse"]] for r in sp] == [v.indices.tolist() for v in sparse]
    np.testing.assert_allclose(np.concatenate([[x["value"] for x in r["sparse"]] for r in sp]),
                               np.concatenate([v.values for v in sparse]), atol=2e-6)

    red = by_id(ds.map_batches(rr.Redact, fn_constructor_kwargs={"path": str(shared_models / "rampart-pii"),
                                                                 "mode": "replace"},
                               concurrency=2, num_cpus=1, batch_size=256, batch_format="pyarrow").take_all())
    done = api_answers(shared_models)["redact"]
    assert [r["redacted"] for r in red] == [d.text for d in done]
    assert [r["redacted_spans"] for r in red] == [[s.to_json() for s in d.spans] for d in done]
    assert [r["text"] for r in red] == texts()


def test_an_actor_killed_mid_job_leaves_every_row_once(cluster, shared_models, tmp_path):
    marker = tmp_path / "killed"

    def dying():
        class Dying(rr.Embed):
            def __call__(self, batch):
                if not marker.exists() and batch.column("id")[0].as_py() >= KILLED_ROWS // 2:
                    marker.touch()
                    os._exit(1)          # the actor's process dies mid-batch
                return super().__call__(batch)

        return Dying

    out = dataset(KILLED_ROWS).map_batches(dying(), fn_constructor_kwargs={"path": str(shared_models /
                                                                                  "all-minilm-l6-v2")},
                                           concurrency=2, num_cpus=1, batch_size=50, batch_format="pyarrow").take_all()
    assert marker.exists()
    rows = by_id(out)
    want = api_answers(shared_models)["embed"][:KILLED_ROWS]      # texts(600) is texts()[:600]
    np.testing.assert_allclose(np.stack([r["embedding"] for r in rows]), want, rtol=0, atol=2e-6)


def test_batch_formats_columns_and_the_error_column(cluster, shared_models):
    path = str(shared_models / "all-minilm-l6-v2")
    items = [{"id": i, "body": t} for i, t in enumerate(["short text", "a much longer text " * 200, "again"])]
    kwargs = {"path": path, "column": "body", "output_column": "vec", "truncate": False, "on_error": "column"}
    for fmt in ("pandas", "numpy"):
        rows = by_id(ray.data.from_items(items).map_batches(rr.Embed, fn_constructor_kwargs=kwargs, concurrency=1,
                                                            num_cpus=1, batch_format=fmt).take_all())
        assert [r["error"] is None for r in rows] == [True, False, True], fmt
        assert "tokens but max_len" in rows[1]["error"] and len(rows[0]["vec"]) == 384
    with pytest.raises(Exception, match=r"row \d of the batch: column 'body': the text has \d+ tokens"):
        ray.data.from_items(items).map_batches(rr.Embed, fn_constructor_kwargs={**kwargs, "on_error": "fail"},
                                               concurrency=1, num_cpus=1, batch_format="pyarrow").take_all()


def test_actor_threads_follow_its_cpus(cluster, shared_models):
    @ray.remote(num_cpus=1)
    def threads() -> int:
        return rr.Embed(path=str(shared_models / "all-minilm-l6-v2")).model._loaded.config.intra_threads

    assert os.cpu_count() != 1 and ray.get(threads.remote(), timeout=120) == 1   # not every CPU of the host
    with pytest.raises(rsinfer_cli.errors.ConfigError, match="dimension: not a key of a model of kind embedding"):
        rr.Embed(path=str(shared_models / "all-minilm-l6-v2"), dimension=8)


def test_json_records_by_policy_with_pseudonyms_agree_across_actors(cluster, shared_models):
    """Two actors, one key: every record as the API redacts it, the same token for a value whichever actor ran it;
    another key gives other tokens."""
    import json

    from test_records import KEY, OTHER, POLICY, check_corpus, corpus

    records = corpus(120)
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    ds = ray.data.from_items([{"id": i, "json": line} for i, line in enumerate(lines)])
    keys = {"path": str(shared_models / "rampart-pii"), "policy": POLICY, "mode": "pseudonym", "column": "json"}
    out = by_id(ds.map_batches(rr.RedactJson, fn_constructor_kwargs={**keys, "key": KEY}, concurrency=2, num_cpus=1,
                               batch_size=25, batch_format="pyarrow").take_all())
    with rsinfer_cli.load(path=str(shared_models / "rampart-pii")) as model:
        want = model.redact_json(lines, POLICY, mode="pseudonym", key=KEY)
    assert [r["redacted"] for r in out] == want
    check_corpus(records, [json.loads(r["redacted"]) for r in out])
    other = by_id(ds.map_batches(rr.RedactJson, fn_constructor_kwargs={**keys, "key": OTHER}, concurrency=1,
                                 num_cpus=1, batch_size=60, batch_format="pyarrow").take_all())
    emails = {json.loads(r["redacted"]).get("user", {}).get("email") for r in out} - {None}
    assert emails.isdisjoint({json.loads(r["redacted"]).get("user", {}).get("email") for r in other})
