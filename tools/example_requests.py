"""One example decision request per kind, all about one state: used by tests, the GPU check and demos."""

from __future__ import annotations

STATE = "The kettle on the stove is whistling and steam is coming out of its spout."

REQUESTS = {
    "choice": {
        "kind": "choice",
        "state": {"text": STATE},
        "question": "Is the water boiling?",
        "options": ["yes", "no", "cannot tell"],
    },
    "noul": {
        "kind": "noul",
        "state": {"text": STATE},
        "question": "What is on the stove?",
        "options": ["a pan", "a kettle"],
    },
    "score": {
        "kind": "score",
        "state": {"text": STATE},
        "question": "How hot is the water, 1 to 5?",
        "options": ["1", "2", "3", "4", "5"],
    },
    "span": {
        "kind": "span",
        "state": {"text": STATE},
        "question": "Which object is whistling?",
        "options": ["kettle", "stove", "steam"],
    },
    "set": {
        "kind": "set",
        "state": {"text": STATE},
        "question": "Which statements are true?",
        "options": ["steam is visible", "the stove is off", "there is a kettle"],
    },
}
