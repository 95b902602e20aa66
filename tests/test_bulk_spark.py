"""rsinfer_cli.spark on a real local Spark (local[2], 4 attempts a task; Java installed by .ci/run): the column
functions embed, sparse-encode and redact a 2,000-row DataFrame as the API does, a Python worker killed mid-job
still leaves every row exactly once, and pairs, nulls and the error policy hold."""


import os
import shutil

import numpy as np
import pytest

import rsinfer_cli
from bulkdata import ROWS, api_answers, texts

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install 'rsinfer[spark]')")

from rsinfer_cli import spark as rs  # noqa: E402

KILLED_ROWS = 600       # the kill test: Spark's task retry is what it shows, not throughput
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore::ResourceWarning")


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    import sys

    if shutil.which("java") is None:
        msg = "no Java runtime (apt-get install openjdk-17-jre-headless)"
        if os.environ.get("RSINFER_REQUIRE_JAVA") == "1":
            pytest.fail(msg + " and RSINFER_REQUIRE_JAVA=1", pytrace=False)
        pytest.skip(msg)
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2,4]").appName("rsinfer-test")
               .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark")))
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def frame(spark, n: int = ROWS, parts: int = 4):
    return spark.createDataFrame([(i, t) for i, t in enumerate(texts(n))], ["id", "text"]).repartition(parts)


def collected(df) -> list:
    rows = df.collect()
    assert sorted(r.id for r in rows) == list(range(len(rows))), "a row was lost or duplicated"
    return sorted(rows, key=lambda r: r.id)


def test_embed_sparse_and_redact_as_the_api(spark, shared_models):
    df = frame(spark)
    embed = rs.embed(path=str(shared_models / "all-minilm-l6-v2"))
    sparse = rs.sparse(path=str(shared_models / "tiny-splade"), top_k=16)
    redact = rs.redact(path=str(shared_models / "rampart-pii"), mode="replace")
    rows = collected(df.withColumn("embedding", embed("text")).withColumn("sparse", sparse("text"))
                     .withColumn("clean", redact("text")))
    assert len(rows) == ROWS
    want = api_answers(shared_models)["embed"]
    np.testing.assert_allclose(np.array([r.embedding for r in rows], dtype=np.float32), want, rtol=0, atol=2e-6)
    vectors = api_answers(shared_models)["sparse"]
    assert [[x["index"] for x in r.sparse] for r in rows] == [v.indices.tolist() for v in vectors]
    done = api_answers(shared_models)["redact"]
    assert [r.clean.text for r in rows] == [d.text for d in done]
    assert [[s.asDict() for s in r.clean.spans] for r in rows] == [[s.to_json() for s in d.spans] for d in done]


def test_a_python_worker_killed_mid_job_leaves_every_row_once(spark, shared_models, tmp_path):
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    marker = str(tmp_path / "killed")

    @pandas_udf("int")
    def die_once(ids: pd.Series) -> pd.Series:
        if not os.path.exists(marker) and (ids >= KILLED_ROWS // 2).any():
            open(marker, "w").close()
            os._exit(1)                  # the executor's Python worker dies mid-task
        return ids * 0

    embed = rs.embed(path=str(shared_models / "all-minilm-l6-v2"))
    rows = collected(frame(spark, KILLED_ROWS).withColumn("embedding", embed("text"))
                     .withColumn("k", die_once("id")))
    assert os.path.exists(marker)
    want = api_answers(shared_models)["embed"][:KILLED_ROWS]      # texts(600) is texts()[:600]
    np.testing.assert_allclose(np.array([r.embedding for r in rows], dtype=np.float32), want, rtol=0, atol=2e-6)


def test_pairs_nulls_and_the_error_column(spark, shared_models):
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(0, "an overdue invoice"), (1, None), (2, "a much longer text " * 200)],
                               "id int, text string").withColumn("q", F.lit("invoice"))
    score = rs.rerank(path=str(shared_models / "tiny-reranker-1"))
    embed = rs.embed(path=str(shared_models / "all-minilm-l6-v2"), truncate=False, on_error="column")
    rows = collected(df.withColumn("score", score("q", "text")).withColumn("e", embed("text")))
    want = rsinfer_cli.load(shared_models / "tiny-reranker-1").score(["invoice"], ["an overdue invoice"])
    assert rows[0].score == pytest.approx(float(want[0]), abs=1e-6) and rows[1].score is None
    assert rows[0].e.error is None and len(rows[0].e.value) == 384
    assert rows[1].e.value is None and rows[1].e.error is None
    assert rows[2].e.value is None and "tokens but max_len" in rows[2].e.error
    failing = rs.embed(path=str(shared_models / "all-minilm-l6-v2"), truncate=False)
    with pytest.raises(Exception, match="row 0 of the batch: column 'text'"):
        df.where("id = 2").withColumn("e", failing("text")).collect()
    with pytest.raises(rsinfer_cli.errors.ConfigError, match="take their columns as arguments"):
        rs.embed(path="x", column="body")


def test_whole_records_redacted_in_place(spark, shared_models):
    rows = [(i, f"Re: invoice {i} for ana.souza{i}@example.org", t) for i, t in enumerate(texts(40))]
    df = spark.createDataFrame(rows, "id int, subject string, text string").repartition(3)
    out = collected(rs.redact_records(df, ["subject", "text"], spans=True, path=str(shared_models / "rampart-pii"),
                                      mode="replace"))
    assert out[0].__fields__ == ["id", "subject", "text", "subject_spans", "text_spans"]
    model = rsinfer_cli.load(shared_models / "rampart-pii")
    subjects = model.redact([r[1] for r in rows], mode="replace")
    bodies = model.redact([r[2] for r in rows], mode="replace")
    assert [r.subject for r in out] == [d.text for d in subjects] and [r.text for r in out] == [d.text for d in bodies]
    assert [[s.asDict() for s in r.text_spans] for r in out] == [[s.to_json() for s in d.spans] for d in bodies]
    assert not any("@example.org" in r.subject for r in out)
    with pytest.raises(rsinfer_cli.errors.ConfigError, match="no column 'body'"):
        rs.redact_records(df, ["body"], path=str(shared_models / "rampart-pii"))


def test_json_records_by_policy_agree_across_executors(spark, shared_models):
    import json

    from test_records import KEY, POLICY, check_corpus, corpus

    records = corpus(80)
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    df = spark.createDataFrame(list(enumerate(lines)), "id int, json string").repartition(4)
    redact = rs.redact_json(path=str(shared_models / "rampart-pii"), policy=POLICY, mode="pseudonym", key=KEY)
    out = collected(df.withColumn("clean", redact("json")))
    model = rsinfer_cli.load(shared_models / "rampart-pii")
    assert [r.clean for r in out] == model.redact_json(lines, POLICY, mode="pseudonym", key=KEY)
    check_corpus(records, [json.loads(r.clean) for r in out])
    bad = spark.createDataFrame([(0, "[1]")], "id int, json string")
    errs = collected(bad.withColumn("c", rs.redact_json(path=str(shared_models / "rampart-pii"), policy=POLICY,
                                                        on_error="column")("json")))
    assert errs[0].c.value is None and "expected a JSON object, got list" in errs[0].c.error
