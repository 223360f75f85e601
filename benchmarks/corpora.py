"""Request corpora for the benchmarks: built-in sets, or JSON lines from a file.

Built-in corpora (each a list of /v1/systemone request bodies, in the order they are sent):

- `mixed`: every kind (choice, noul, score, span, set) over six different states.
- `shared-prefix`: many questions about the same three long states (choice kind), state-major, so
  the L3 prefix cache can serve every question after the first one on each state.
- `set`: `set`-kind requests with five options each, several per state, state-major, so concurrent
  requests share a prefix and each request has five candidate rows to batch.
- `ordered`: System One requests shaped like jevbench's (four noul, two choice of four described options and one
  score of four levels about one state), four per long state (the options and levels as written, reversed, and
  shifted by one and two); `ordered-cyclic` is the same requests with `x_coherence: "cyclic"` (the coherence
  group compares the two: what the mode costs per answer).

Every corpus but `ordered` (and `ordered-cyclic`) is the single-question form. A file corpus is JSON lines,
one request object a line (blank lines and lines starting with # skipped).
"""

from __future__ import annotations

from pathlib import Path

from tools.compare_with_backend import load_corpus as read_jsonl_requests

_KITCHEN = (
    "The kitchen has a red kettle on a gas stove, and the kettle has just started to whistle. "
    "The window above the sink is open and it is raining hard outside; a puddle is forming on the sill. "
    "A grey cat sleeps on a wooden chair next to the table, where a half-eaten sandwich lies on a plate. "
    "A radio in the corner plays quietly, and the clock on the wall says a quarter past seven."
)
_STATION = (
    "Platform four of the central station is crowded. The departure board shows the 8:15 train to the "
    "coast as delayed by twenty minutes, and the 8:30 to the capital as on time. A guard in a blue "
    "uniform is checking tickets at the gate, a child holds a yellow balloon, and a vending machine "
    "next to the stairs has an out-of-order sign taped to its glass."
)
_GARDEN = (
    "In the garden the tomatoes are ripe and red, but the lettuce has bolted and tastes bitter. "
    "The hose is coiled by the shed, whose door is open. Two sparrows bathe in a shallow dish of "
    "water, the grass has not been cut for weeks, and a wheelbarrow full of leaves stands by the gate. "
    "Clouds are gathering in the west and the wind is picking up."
)
_OFFICE = (
    "The office on the third floor is quiet this morning. Two of the six desks are occupied; the printer "
    "by the door shows a paper-jam light, and the coffee machine has a fresh pot. A whiteboard lists "
    "three deadlines for Friday, the blinds are half closed against the low sun, and a courier is "
    "waiting at reception with a parcel that needs a signature."
)
LONG_STATES = (_KITCHEN, _STATION, _GARDEN)  # shared-prefix and set corpora only (mixed has its own)

_QUESTIONS = {
    _KITCHEN: [
        ("Is the water in the kettle boiling?", ["yes", "no", "cannot tell"]),
        ("What is the weather outside?", ["sunny", "raining", "snowing"]),
        ("Where is the cat?", ["on a chair", "on the table", "outside"]),
        ("What time is it?", ["about seven", "noon", "midnight"]),
        ("Is the window closed?", ["yes", "no"]),
        ("What is on the plate?", ["a sandwich", "a cake", "nothing"]),
        ("What colour is the kettle?", ["red", "blue", "green"]),
        ("Is someone listening to music?", ["probably", "no", "cannot tell"]),
    ],
    _STATION: [
        ("Which train is delayed?", ["the train to the coast", "the train to the capital", "neither"]),
        ("How long is the delay?", ["five minutes", "twenty minutes", "an hour"]),
        ("Who checks the tickets?", ["a guard", "a child", "a machine"]),
        ("Does the vending machine work?", ["yes", "no"]),
        ("What does the child hold?", ["a balloon", "a ticket", "a kite"]),
        ("Is the platform empty?", ["yes", "no"]),
        ("When does the train to the capital leave?", ["8:15", "8:30", "8:45"]),
        ("What colour is the guard's uniform?", ["blue", "red", "black"]),
    ],
    _GARDEN: [
        ("Are the tomatoes ready to pick?", ["yes", "no"]),
        ("How does the lettuce taste?", ["sweet", "bitter", "salty"]),
        ("Is the shed door open?", ["yes", "no", "cannot tell"]),
        ("Which birds are in the garden?", ["sparrows", "crows", "none"]),
        ("Does the lawn need mowing?", ["yes", "no"]),
        ("What is in the wheelbarrow?", ["leaves", "soil", "tomatoes"]),
        ("What might the weather do soon?", ["turn stormy", "stay calm", "get hotter"]),
        ("Where is the hose?", ["by the shed", "in the house", "on the lawn"]),
    ],
}

_SET_STATEMENTS = {
    _KITCHEN: [
        ["the kettle is whistling", "it is sunny", "a cat is asleep", "the radio is off", "the window is open"],
        ["there is a sandwich", "the stove is electric", "it is evening", "the sill is dry", "the cat is grey"],
        ["the clock is on the wall", "the kettle is blue", "it is raining", "the table is empty", "there is a chair"],
        ["someone is cooking", "the cat is awake", "water is boiling", "the room is silent", "the plate is full"],
    ],
    _STATION: [
        ["a train is delayed", "the platform is empty", "a guard is present", "the machine works", "a child is there"],
        ["the balloon is yellow", "the capital train is late", "tickets are checked", "it is 9 pm", "there are stairs"],
        [
            "the guard wears blue",
            "the board shows departures",
            "the coast train is on time",
            "a sign is taped",
            "nobody is waiting",
        ],
        [
            "the station is central",
            "the delay is an hour",
            "the gate is unattended",
            "it is morning",
            "there is a vending machine",
        ],
    ],
    _GARDEN: [
        ["the tomatoes are ripe", "the lettuce is sweet", "the shed is open", "there are birds", "the grass is short"],
        ["the hose is coiled", "it is windy", "the wheelbarrow is empty", "sparrows are bathing", "the sky is clear"],
        [
            "the lettuce bolted",
            "the gate has a wheelbarrow",
            "the lawn was cut yesterday",
            "clouds gather",
            "there is water",
        ],
        [
            "it may rain soon",
            "the tomatoes are green",
            "leaves are in the barrow",
            "the shed is locked",
            "the dish is deep",
        ],
    ],
}


def shared_prefix() -> list[dict]:
    return [
        {
            "kind": "choice",
            "state": {"text": state},
            "question": question,
            "options": options,
            "request_id": f"sp-{s}-{q}",
        }
        for s, state in enumerate(LONG_STATES)
        for q, (question, options) in enumerate(_QUESTIONS[state])
    ]


def set_kind() -> list[dict]:
    return [
        {
            "kind": "set",
            "state": {"text": state},
            "question": "Which statements are true?",
            "options": options,
            "request_id": f"set-{s}-{q}",
        }
        for s, state in enumerate(LONG_STATES)
        for q, options in enumerate(_SET_STATEMENTS[state])
    ]


def mixed() -> list[dict]:
    short = [
        ("The light is red and the car is moving.", "What should the driver do?", ["stop", "accelerate", "turn"]),
        ("A cat sits on a warm mat by the fire.", "Where is the cat?", ["on the mat", "in a tree"]),
        ("The box contains three apples and a pear.", "What is in the box?", ["fruit", "tools", "books"]),
    ]
    out: list[dict] = []
    for i, (state, question, options) in enumerate(short):
        out.append(
            {"kind": "choice", "state": state, "question": question, "options": options, "request_id": f"mx-choice-{i}"}
        )
        out.append(
            {"kind": "noul", "state": state, "question": question, "options": options[:2], "request_id": f"mx-noul-{i}"}
        )
    out += [
        {
            "kind": "score",
            "state": "The film was long but the acting was superb.",
            "question": "Rate the review from 1 to 5.",
            "options": ["1", "2", "3", "4", "5"],
            "request_id": "mx-score-0",
        },
        {
            "kind": "span",
            "state": "Alice met Bob in Paris on Monday.",
            "question": "Where did they meet?",
            "options": ["Paris", "Monday", "Alice"],
            "request_id": "mx-span-0",
        },
        {
            "kind": "set",
            "state": "The soup is hot, salty and green.",
            "question": "Which statements are true?",
            "options": ["The soup is hot", "The soup is cold", "The soup is green"],
            "request_id": "mx-set-0",
        },
    ]
    for q, (question, options) in enumerate(
        [
            ("How many desks are occupied?", ["two", "four", "six"]),
            ("Does the printer work?", ["yes", "no", "cannot tell"]),
            ("Who is waiting at reception?", ["a courier", "a client", "nobody"]),
        ]
    ):
        out.append(
            {"kind": "choice", "state": _OFFICE, "question": question, "options": options, "request_id": f"mx-long-{q}"}
        )
    return out


_ORDERED = {
    _KITCHEN: (
        {
            "kettle": "Is the kettle whistling?",
            "rain": "Is it raining outside?",
            "cat": "Is the cat awake?",
            "radio": "Is the radio loud?",
        },
        [
            (
                "What needs attention first?",
                {
                    "kettle": "take it off the stove",
                    "window": "close it against the rain",
                    "cat": "feed the cat",
                    "sandwich": "finish the sandwich",
                },
            ),
            (
                "What time of day is it?",
                {
                    "morning": "around breakfast",
                    "noon": "around lunch",
                    "evening": "after work",
                    "night": "after midnight",
                },
            ),
        ],
        ("How urgent is the kitchen's state?", ["calm", "a little", "urgent", "an emergency"]),
    ),
    _STATION: (
        {
            "delayed": "Is the coast train delayed?",
            "guard": "Is a guard checking tickets?",
            "machine": "Does the vending machine work?",
            "balloon": "Is the balloon red?",
        },
        [
            (
                "Which train leaves on time?",
                {
                    "coast": "the 8:15 to the coast",
                    "capital": "the 8:30 to the capital",
                    "airport": "the airport shuttle",
                    "none": "no train leaves on time",
                },
            ),
            (
                "Who wears a blue uniform?",
                {
                    "guard": "the guard at the gate",
                    "child": "the child",
                    "driver": "the train driver",
                    "cleaner": "a cleaner",
                },
            ),
        ],
        ("How crowded is the platform?", ["empty", "a few people", "busy", "packed"]),
    ),
    _GARDEN: (
        {
            "ripe": "Are the tomatoes ripe?",
            "lettuce": "Is the lettuce good to eat?",
            "shed": "Is the shed door open?",
            "rain": "Is rain likely soon?",
        },
        [
            (
                "What should be done first?",
                {
                    "harvest": "pick the tomatoes",
                    "mow": "cut the grass",
                    "leaves": "empty the wheelbarrow",
                    "water": "water the lettuce",
                },
            ),
            (
                "Which birds are in the garden?",
                {"sparrows": "two sparrows", "crows": "a crow", "robins": "robins", "none": "no birds"},
            ),
        ],
        ("How well kept is the garden?", ["neglected", "untidy", "tidy", "immaculate"]),
    ),
}


_ORDERS = (lambda x: x, lambda x: x[::-1], lambda x: x[1:] + x[:1], lambda x: x[2:] + x[:2])


def ordered(coherence: str | None = None) -> list[dict]:
    out = []
    for state, (nouls, choices, score) in _ORDERED.items():
        for order in _ORDERS:  # the options (and levels) as written, reversed, and shifted by one and two
            questions: dict = {k: {"type": "noul", "instructions": q} for k, q in nouls.items()}
            for c, (question, options) in enumerate(choices):
                questions[f"choice{c}"] = {
                    "type": "choice",
                    "instructions": question,
                    "criteria": dict(order(list(options.items()))),
                }
            questions["score"] = {"type": "score", "instructions": score[0], "criteria": order(score[1])}
            body = {"model": "jev-latest", "state": state, "questions": questions}
            out.append(body if coherence is None else {**body, "x_coherence": coherence})
    return out


BUILTIN = {"mixed": mixed, "shared-prefix": shared_prefix, "set": set_kind}  # the single-question form
# System One requests (the coherence group's): load_corpus names them; the readers of BUILTIN (cpu_accuracy,
# l3_replay, gpu_check's trained tokenizer) take the single-question form only
SYSTEM_ONE = {"ordered": ordered, "ordered-cyclic": lambda: ordered("cyclic")}

# One request unlike any corpus entry (its own state), for warming connections without warming caches.
WARMUP_BODY = {
    "kind": "choice",
    "state": {"text": "Warm-up: the benchmark is about to start."},
    "question": "Is this a warm-up request?",
    "options": ["yes", "no"],
    "request_id": "warmup",
}


def load_corpus(name_or_path: str) -> list[dict]:
    """A built-in corpus by name, or a JSON-lines file of request objects."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]()
    if name_or_path in SYSTEM_ONE:
        return SYSTEM_ONE[name_or_path]()
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"corpus {name_or_path!r} is neither a built-in ({', '.join([*BUILTIN, *SYSTEM_ONE])}) nor a file"
        )
    return read_jsonl_requests(path)
