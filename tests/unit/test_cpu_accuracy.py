"""benchmarks.cpu_accuracy: the rows it scores are the worker's own, and its table compares like with like."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def builder():
    from transformers import AutoTokenizer

    from jev_common.recipe import load_recipe
    from jev_worker.prompt.builder import ChatPromptBuilder
    from tools.tiny_checkpoints import SMOLLM2_GGUF, smollm2_folder

    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF)
    return ChatPromptBuilder(tokenizer, load_recipe("smollm2-135m-cpu"), "test")


def test_every_corpus_request_becomes_rows_with_labels(builder):
    from benchmarks.corpora import BUILTIN
    from benchmarks.cpu_accuracy import corpus_requests, prepared_rows

    requests = corpus_requests(with_255=True)
    assert len(requests) == sum(len(make()) for make in BUILTIN.values()) + 5 + 1
    rows = prepared_rows(builder, requests)
    names = {name.split("/")[0] for name, _, _ in rows}
    assert names == {name for name, _ in requests}  # no request lost
    assert all(ids and labels for _, ids, labels in rows)
    (long_row,) = [row for row in rows if row[0].startswith("jevcompat-255/")]
    assert len(long_row[2]) == 255 and len(long_row[1]) > 4000


def test_whole_rows_equal_the_prepared_prefix_plus_row(builder):
    from benchmarks.cpu_accuracy import prepared_rows
    from jev_common.schema import DecisionRequest
    from jev_worker.request.legacy import prepare_legacy
    from tools.example_requests import REQUESTS

    request = DecisionRequest.model_validate(REQUESTS["choice"])
    prepared = prepare_legacy(builder, request)
    ((_, ids, labels),) = prepared_rows(builder, [("x", request)])
    assert ids == tuple(prepared.prefix_ids) + tuple(prepared.rows[0]) and labels == prepared.row_labels[0]
