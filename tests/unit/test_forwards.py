"""forwards.py's packing of rows after prefix states: rows that begin with the same tokens share one stem (a choice's
cyclic shifts share their question line), and packed forwards stay within JEV_PACK_TOKENS; answers do not change."""

from __future__ import annotations

from jev_worker.engine.forwards import Segment, packs, segments

from .worker_helpers import record_forwards, worker_client

A, B = object(), object()  # two prefix states
STEM = tuple(range(100, 110))  # 10 shared leading tokens


def test_rows_after_one_state_that_begin_alike_share_a_stem():
    pairs = [
        (A, STEM + (1, 2)),
        (A, STEM + (3,)),
        (A, STEM[:9] + (4, 5)),  # 9 shared with the first two
        (A, (7, 8, 9)),
        (B, STEM + (1,)),
        (B, STEM + (2,)),
        (A, STEM + (6,)),
    ]
    assert segments(pairs) == [Segment((0, 1, 2), 9), Segment((3,)), Segment((4, 5), 10), Segment((6,))]
    assert Segment((0, 1, 2), 9).tokens(pairs) == 9 + 3 + 2 + 2  # the stem once, then each row's rest


def test_a_stem_leaves_every_row_its_last_token_and_short_runs_are_not_stems():
    same = STEM + (1,)
    assert segments([(A, same), (A, same)]) == [Segment((0, 1), len(same) - 1)]  # equal rows: each keeps a token
    assert segments([(A, (1, 2, 3, 4, 5, 6, 7, 9)), (A, (1, 2, 3, 4, 5, 6, 7, 8))]) == [Segment((0,)), Segment((1,))]


def test_packs_stay_within_the_budget_in_order_and_split_a_long_segment():
    pairs = [(A, STEM + tuple(range(20 * i, 20 * i + 20))) for i in range(4)] + [(A, tuple(range(500, 560)))]
    unbounded = packs(pairs, 0)
    assert unbounded == [[Segment((0, 1, 2, 3), 10), Segment((4,))]]
    bounded = packs(pairs, 64)  # one stem + 20-token rests: two rows a part, the stem run once per part
    assert bounded == [[Segment((0, 1), 10)], [Segment((2, 3), 10)], [Segment((4,))]]
    assert [r for pack in bounded for s in pack for r in s.rows] == list(range(5))
    assert all(sum(s.tokens(pairs) for s in pack) <= 64 for pack in bounded)


def answers(body: dict) -> dict:
    return {qid: a.get("probabilities", a.get("noul")) for qid, a in body["answers"].items()}


async def test_shift_rows_run_their_shared_question_line_once_and_answer_as_the_padded_rows(worker_settings):
    body = {
        "model": "jev-latest",
        "state": "The kettle on the stove is whistling.",
        "x_coherence": "cyclic",
        "questions": {
            "c": {
                "type": "choice",
                "instructions": "What is the kettle doing right now in the kitchen?",
                "criteria": {"boiling": "water at 100 C", "cooling": None, "broken": None, "singing": "a tune"},
            }
        },
    }
    async with worker_client(worker_settings()) as (client, service):
        forwards = record_forwards(service.model.engine)
        packed = await (await client.post("/v1/systemone", json=body)).json()
        rows = [kw for kw in forwards if kw.get("attention_mask") is not None and kw["attention_mask"].dim() == 4]
        shifts = _rows(service, body)
        assert len(shifts) == 4  # every shift its row
        assert rows and rows[-1]["input_ids"].shape[1] < sum(map(len, shifts))  # the stem ran once, not per shift
        service.model.engine.forwards.packing = False
        padded = await (await client.post("/v1/systemone", json=dict(body, state=body["state"] + " "))).json()
        again = await (await client.post("/v1/systemone", json=body)).json()
    assert padded["answers"].keys() == packed["answers"].keys()
    for option, p in answers(packed)["c"].items():
        assert abs(p - answers(again)["c"][option]) <= 1e-5


async def test_a_small_pack_budget_splits_the_rows_into_more_forwards_with_the_same_answers(worker_settings):
    body = {
        "model": "jev-latest",
        "state": "The kettle on the stove is whistling.",
        "questions": {
            f"n{i}": {"type": "noul", "instructions": f"Is statement number {i} about the kettle true?"}
            for i in range(6)
        },
    }
    async with worker_client(worker_settings()) as (client, service):
        whole = await (await client.post("/v1/systemone", json=body)).json()
    async with worker_client(worker_settings(pack_tokens=40)) as (client, service):
        forwards = record_forwards(service.model.engine)
        split = await (await client.post("/v1/systemone", json=body)).json()
        packed = [kw for kw in forwards if kw.get("attention_mask") is not None and kw["attention_mask"].dim() == 4]
        assert len(packed) > 1 and all(kw["input_ids"].shape[1] <= 40 for kw in packed)
    for qid in body["questions"]:
        assert abs(whole["answers"][qid]["noul"] - split["answers"][qid]["noul"]) <= 1e-5


def _rows(service, body):
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for

    model = service.model
    request = SystemOneRequest.model_validate(body)
    rows, plan = rows_for(
        request.questions, request.state, model.builder, model.readout.kinds, model.readout.name, request.x_coherence
    )
    return model.builder.prepare(request.state, rows, (), plan).rows
