"""--task from a checkpoint (catalog/model_tasks.py), torch-free: what vLLM and SGLang read
(sentence-transformers' modules.json and 1_Pooling/config.json, a classifier's architecture)
and the one-line refusals of what cannot be served."""

from __future__ import annotations

import json

import pytest

from radixserve.catalog.architectures import UnsupportedModelError, check_architecture
from radixserve.catalog.model_tasks import ModelTask, TaskError, resolve_task

CAUSAL = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}


def sentence_transformers_dir(tmp_path, mode: str, normalize: bool = True):
    tmp_path.mkdir()
    modules = [{"type": "sentence_transformers.models.Transformer", "path": ""}]
    modules.append({"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"})
    if normalize:
        modules.append({"type": "sentence_transformers.models.Normalize", "path": "2_Normalize"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{mode}": True}))
    return tmp_path


def test_sentence_transformers_files_decide_pooling_and_normalisation(tmp_path):
    last = resolve_task("auto", CAUSAL, sentence_transformers_dir(tmp_path / "a", "lasttoken"))
    assert (last.task, last.pooling, last.normalize) == ("embed", "last", True)
    mean = resolve_task(
        "auto", CAUSAL, sentence_transformers_dir(tmp_path / "b", "mean_tokens", False)
    )
    assert (mean.task, mean.pooling, mean.normalize) == ("embed", "mean", False)
    with pytest.raises(TaskError, match="cls_token"):
        resolve_task("auto", CAUSAL, sentence_transformers_dir(tmp_path / "c", "cls_token"))


def test_architectures_and_names_decide_without_those_files():
    classifier = {"architectures": ["Qwen3ForSequenceClassification"], "num_labels": 1}
    assert resolve_task("auto", classifier, None) == ModelTask(
        "rerank", head="score", reason="architecture Qwen3ForSequenceClassification"
    )
    bare = resolve_task("auto", {"architectures": ["MistralModel"]}, None)
    assert (bare.task, bare.pooling, bare.normalize) == ("embed", "last", True)
    by_name = resolve_task("auto", CAUSAL, None, "Qwen/Qwen3-Reranker-0.6B")
    assert (by_name.task, by_name.head) == ("rerank", "yes_no")
    assert resolve_task("auto", CAUSAL, None, "/models/my-embedding-model/").task == "embed"
    assert resolve_task("auto", CAUSAL, None, "Qwen/Qwen3-0.6B") == ModelTask()


def test_asked_tasks_override_detection_where_the_weights_allow():
    assert resolve_task("embed", CAUSAL, None).pooling == "last"
    assert resolve_task("rerank", CAUSAL, None).head == "yes_no"
    assert resolve_task("generate", CAUSAL, None, "Qwen3-Reranker").task == "generate"
    classifier = {"architectures": ["LlamaForSequenceClassification"]}
    with pytest.raises(TaskError, match="rerank only"):
        resolve_task("embed", classifier, None)
    with pytest.raises(TaskError, match="3 labels"):
        resolve_task("auto", {**classifier, "num_labels": 3}, None)
    with pytest.raises(TaskError, match="no LM head"):
        resolve_task("generate", {"architectures": ["Qwen3Model"]}, None)


def test_classifier_and_bare_architectures_are_served_as_their_causal_lm():
    assert check_architecture("qwen3", ["Qwen3ForSequenceClassification"]) == "Qwen3ForCausalLM"
    assert check_architecture("mistral", ["MistralModel"]) == "MistralForCausalLM"
    with pytest.raises(UnsupportedModelError):
        check_architecture("bert", ["BertModel"])


def test_what_the_pooler_would_get_wrong_is_refused(tmp_path):
    directory = sentence_transformers_dir(tmp_path / "dense", "mean_tokens")
    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"type": "sentence_transformers.models.Dense", "path": "2_Dense"})
    (directory / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(TaskError, match="Dense"):
        resolve_task("auto", CAUSAL, directory)
    bidirectional = {"architectures": ["Gemma3TextModel"], "use_bidirectional_attention": True}
    with pytest.raises(TaskError, match="bidirectional"):
        resolve_task("auto", bidirectional, None)


def test_a_task_the_checkpoint_cannot_do_fails_the_start_before_anything_loads(tmp_path):
    from radixserve.frontend.engine import EngineStartupError, check_model
    from radixserve.server_args import ServerArgs

    classifier = {**CAUSAL, "architectures": ["Qwen3ForSequenceClassification"]}
    (tmp_path / "config.json").write_text(json.dumps(classifier))
    with pytest.raises(EngineStartupError, match="serves --task rerank only"):
        check_model(ServerArgs(model=str(tmp_path), task="embed"))
    check_model(ServerArgs(model=str(tmp_path), task="rerank"))
