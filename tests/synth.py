"""Small synthetic models for unit tests: a word-level tokenizer and ONNX graphs built with onnx.helper."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = ["hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "yes", "no"]
VOCAB = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
DIM = 4


def tokenizer_json() -> str:
    """A BERT-like word-level tokenizer: `[CLS] a [SEP]` and `[CLS] a [SEP] b [SEP]` with type ids 0/1."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok.to_str()


def embedding_table() -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.standard_normal((len(VOCAB), DIM)).astype(np.float32)


def embedding_graph(*, position_ids: bool = False, past_layers: int = 0, out_name: str = "last_hidden_state",
                    extra_input: str | None = None, opset: int = 17):
    """input_ids/attention_mask/token_type_ids → out = table[input_ids] (+ position_ids as float)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    seq = ["batch_size", "sequence_length"]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, seq),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, seq),
              helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, seq)]
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["hidden"])]
    outputs = [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["batch_size", "sequence_length", DIM])]
    last = "hidden"
    if position_ids:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, seq))
        nodes += [helper.make_node("Cast", ["position_ids"], ["pos_f"], to=TensorProto.FLOAT),
                  helper.make_node("Unsqueeze", ["pos_f", "axis_last"], ["pos_3d"]),
                  helper.make_node("Add", [last, "pos_3d"], ["hidden_pos"])]
        last = "hidden_pos"
        outputs.append(helper.make_tensor_value_info("positions", TensorProto.INT64, seq))
        nodes.append(helper.make_node("Identity", ["position_ids"], ["positions"]))
    for layer in range(past_layers):
        for kv in ("key", "value"):
            name = f"past_key_values.{layer}.{kv}"
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                        ["batch_size", 2, "past_sequence_length", 8]))
            outputs.append(helper.make_tensor_value_info(f"present.{layer}.{kv}", TensorProto.INT64, [4]))
            nodes.append(helper.make_node("Shape", [name], [f"present.{layer}.{kv}"]))
    if extra_input:
        inputs.append(helper.make_tensor_value_info(extra_input, TensorProto.INT64, seq))
        outputs.append(helper.make_tensor_value_info("extra_out", TensorProto.INT64, seq))
        nodes.append(helper.make_node("Identity", [extra_input], ["extra_out"]))
    nodes += [helper.make_node("Identity", [last], [out_name]),
              # consume attention_mask and token_type_ids so ORT keeps them as graph inputs
              helper.make_node("Add", ["attention_mask", "token_type_ids"], ["mask_plus_types"])]
    outputs.append(helper.make_tensor_value_info("mask_plus_types", TensorProto.INT64, seq))
    inits = [numpy_helper.from_array(embedding_table(), "table")]
    if position_ids:
        inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last"))
    graph = helper.make_graph(nodes, "synthetic", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def graph_bytes(model) -> bytes:
    return model.SerializeToString()


def write_model_dir(root: Path, *, graph_rel: str = "onnx/model.onnx", model=None, external_data: bool = False,
                    pooling: str | None = "pooling_mode_mean_tokens", config: dict | None = None) -> Path:
    """A Hub-repo layout on disk: tokenizer.json, config.json, 1_Pooling/config.json and the graph."""
    import onnx

    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    (root / "config.json").write_text(json.dumps(config or {"architectures": ["BertModel"],
                                                            "max_position_embeddings": 64}), encoding="utf-8")
    if pooling:
        (root / "1_Pooling").mkdir(exist_ok=True)
        (root / "1_Pooling" / "config.json").write_text(json.dumps({pooling: True}), encoding="utf-8")
    g = root / graph_rel
    g.parent.mkdir(parents=True, exist_ok=True)
    m = model or embedding_graph()
    if external_data:
        onnx.save_model(m, str(g), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=g.name + "_data", size_threshold=0)
    else:
        onnx.save_model(m, str(g))
    return root


def dir_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def vocab_logits_graph(seed: int = 3):
    """A decoder-style scorer: logits [B, S, V] where position t holds the sum of table[ids[:t+1]] (CumSum),
    so the last real token's logits depend on every real token and on none of the padding."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    seq = ["batch_size", "sequence_length"]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, seq),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, seq)]
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
             helper.make_node("CumSum", ["rows", "axis1"], ["logits"]),
             helper.make_node("Identity", ["attention_mask"], ["mask_out"])]
    vocab_dims = ["batch_size", "sequence_length", len(VOCAB)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, vocab_dims),
               helper.make_tensor_value_info("mask_out", TensorProto.INT64, seq)]
    inits = [numpy_helper.from_array(vocab_table(seed), "table"),
             numpy_helper.from_array(np.array(1, dtype=np.int64), "axis1")]
    model = helper.make_model(helper.make_graph(nodes, "vocab_scorer", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def vocab_table(seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((len(VOCAB), len(VOCAB))).astype(np.float32)


def classifier_graph(num_labels: int, seed: int = 5):
    """A cross-encoder-like classifier: logits [B, num_labels] = mean over real tokens of table[ids]
    (token type ids shift the ids so the pair's second text counts differently)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    seq = ["batch_size", "sequence_length"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, seq)
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    nodes = [helper.make_node("Mul", ["token_type_ids", "shift"], ["shifted"]),
             helper.make_node("Add", ["input_ids", "shifted"], ["ids2"]),
             helper.make_node("Gather", ["table", "ids2"], ["rows"]),
             helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["maskf", "axis_last"], ["mask3"]),
             helper.make_node("Mul", ["rows", "mask3"], ["masked"]),
             helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
             helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
             helper.make_node("Div", ["summed", "count"], ["logits"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", num_labels])]
    table = np.random.default_rng(seed).standard_normal((2 * len(VOCAB), num_labels)).astype(np.float32)
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array(len(VOCAB), dtype=np.int64), "shift"),
             numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")]
    model = helper.make_model(helper.make_graph(nodes, "classifier", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, table


def add_graph(path: Path, value: float = 1.0, width: int = 2) -> Path:
    """An ONNX graph Y = X + value over float32 [batch, width] (a tensor model), saved at `path`."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", width])
    const = helper.make_tensor("value", TensorProto.FLOAT, [1], [value])
    graph = helper.make_graph([helper.make_node("Add", ["X", "value"], ["Y"])], "add", [x], [y], initializer=[const])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def pooled_graph(weight: np.ndarray | None = None, bias: np.ndarray | None = None, *, tokens: bool = True):
    """An embedding graph whose `sentence_embedding` [B, D] is the masked mean of table[input_ids], and with `weight`
    a Dense baked in: tanh(mean · weight + bias) (an onnx-community-style export). `tokens`: also output the token
    vectors (`last_hidden_state`), as such exports do."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    seq = ["batch_size", "sequence_length"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, seq)
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["hidden"]),
             helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["maskf", "axis_last"], ["mask3"]),
             helper.make_node("Mul", ["hidden", "mask3"], ["masked"]),
             helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
             helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
             helper.make_node("Div", ["summed", "count"], ["mean"]),
             helper.make_node("Add", ["attention_mask", "token_type_ids"], ["mask_plus_types"])]
    inits = [numpy_helper.from_array(embedding_table(), "table"),
             numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis_last"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")]
    width = DIM
    if weight is not None:
        nodes += [helper.make_node("MatMul", ["mean", "dense_w"], ["projected"]),
                  helper.make_node("Add", ["projected", "dense_b"], ["biased"]),
                  helper.make_node("Tanh", ["biased"], ["sentence_embedding"])]
        inits += [numpy_helper.from_array(weight.T.astype(np.float32), "dense_w"),
                  numpy_helper.from_array((bias if bias is not None else np.zeros(weight.shape[0]))
                                          .astype(np.float32), "dense_b")]
        width = weight.shape[0]
    else:
        nodes.append(helper.make_node("Identity", ["mean"], ["sentence_embedding"]))
    outputs = [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch_size", width]),
               helper.make_tensor_value_info("mask_plus_types", TensorProto.INT64, seq)]
    if tokens:
        nodes.append(helper.make_node("Identity", ["hidden"], ["last_hidden_state"]))
        outputs.append(helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                                     ["batch_size", "sequence_length", DIM]))
    model = helper.make_model(helper.make_graph(nodes, "pooled", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_st_modules(root: Path, modules: list[tuple[str, str, dict | None]], *,
                     weights: dict[str, dict[str, np.ndarray]] | None = None, st_config: dict | None = None) -> None:
    """A sentence-transformers layout over a folder from `write_model_dir`: modules.json from (type, path, config)
    - the type's short name becomes sentence_transformers.models.<name> unless it has a dot - each module's
    config.json, safetensors weights by folder, and config_sentence_transformers.json."""
    from safetensors.numpy import save_file

    entries = []
    for i, (kind, path, cfg) in enumerate(modules):
        entries.append({"idx": i, "name": str(i), "path": path,
                        "type": kind if "." in kind else f"sentence_transformers.models.{kind}"})
        if path and cfg is not None:
            (root / path).mkdir(parents=True, exist_ok=True)
            (root / path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    (root / "modules.json").write_text(json.dumps(entries), encoding="utf-8")
    for folder, tensors in (weights or {}).items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        save_file({k: v.astype(np.float32) for k, v in tensors.items()}, str(root / folder / "model.safetensors"))
    if st_config is not None:
        (root / "config_sentence_transformers.json").write_text(json.dumps(st_config), encoding="utf-8")


# How torch.onnx.export writes `logits_per_text = cos * logit_scale.exp() (+ logit_bias)` (seen on transformers 5.25,
# torch 2.13): the TorchScript exporter keeps `Exp(logit_scale)` and casts it; dynamo folds it into an initializer;
# other tools leave a Constant node.
STYLES = ("exp_cast", "folded", "constant")


def combined_tail(path: Path, kind: str, scale: float, bias: float, style: str) -> None:
    """A combined graph's tail as the exporters write it: text_embeds and image_embeds in, unit-normalised, their
    cosines scaled (and shifted, SigLIP) into logits_per_text, transposed into logits_per_image."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes = [helper.make_node("ReduceL2", ["text_embeds", "axes"], ["tn"], keepdims=1),
             helper.make_node("Div", ["text_embeds", "tn"], ["t"]),
             helper.make_node("ReduceL2", ["image_embeds", "axes"], ["inorm"], keepdims=1),
             helper.make_node("Div", ["image_embeds", "inorm"], ["i"]),
             helper.make_node("Transpose", ["i"], ["it"], perm=[1, 0]),
             helper.make_node("MatMul", ["t", "it"], ["cos"])]
    if style == "exp_cast":
        inits.append(numpy_helper.from_array(np.array(scale, np.float32), "m.logit_scale"))
        nodes += [helper.make_node("Exp", ["m.logit_scale"], ["e"]), helper.make_node("Cast", ["e"], ["s"], to=f)]
    elif style == "folded":
        inits.append(numpy_helper.from_array(np.exp(np.array([scale], np.float32)), "s"))
    else:
        nodes.append(helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(
            np.exp(np.array(scale, np.float32)), "c")))
    nodes.append(helper.make_node("Mul", ["cos", "s"], ["scaled"]))
    if kind == "siglip":
        inits.append(numpy_helper.from_array(np.array([bias], np.float32), "onnx::Add_865"))
        nodes.append(helper.make_node("Add", ["scaled", "onnx::Add_865"], ["logits_per_text"]))
    else:
        nodes.append(helper.make_node("Identity", ["scaled"], ["logits_per_text"]))
    nodes.append(helper.make_node("Transpose", ["logits_per_text"], ["logits_per_image"], perm=[1, 0]))
    graph = helper.make_graph(
        nodes, "combined", [helper.make_tensor_value_info("text_embeds", f, ["t", "d"]),
                            helper.make_tensor_value_info("image_embeds", f, ["i", "d"])],
        [helper.make_tensor_value_info(n, f, None) for n in ("logits_per_image", "logits_per_text")], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))


def xenova_folder(src: Path, dest: Path, style: str) -> tuple[Path, dict, str]:
    """`src` in Xenova's layout: its towers and files linked, no model.safetensors, a combined onnx/model.onnx."""
    ref = json.loads((src / "reference.json").read_text(encoding="utf-8"))
    kind = "siglip" if "logit_bias" in ref["settings"] else "clip"
    (dest / "onnx").mkdir(parents=True)
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_file() and f.name != "model.safetensors" and not (dest / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).symlink_to(f)
    combined_tail(dest / "onnx" / "model.onnx", kind, ref["settings"]["logit_scale"],
                  ref["settings"].get("logit_bias", 0.0), style)
    return dest, ref, kind

