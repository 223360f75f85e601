"""One request of N questions about a state vs N one-question requests about it, side by side.

Both arms ask the same questions about the same states of one worker (`python -m jev_worker`, the
embedded SmolLM2 by default) at concurrency 1, in interleaved rounds so machine noise hits both:
  many   N requests of one question each (the state prefix comes from L3 after the first)
  one    one request with all N questions (one prefix, N rows in one batched forward)
Printed: decisions/s (questions answered per second), p50 and p95 of the time to have all N answers
of a state, their ratio, the L3 hit rate of each arm, and how far the two arms' answers are apart.

    python -m benchmarks.questions_per_request [--model tiny] [--states 6] [--questions 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from .loadgen import percentile
from .run_all import DEFAULT_OUT, model_env
from .stack import Stack, get_json

QUESTIONS = [
    {"type": "noul", "instructions": "Is the customer asking for money back?"},
    {"type": "noul", "instructions": "Does the customer threaten to leave?"},
    {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages", "Sales": "Pricing"},
    },
    {
        "type": "choice",
        "instructions": "What language is the message in?",
        "criteria": {"English": None, "Other": None},
    },
    {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["Calm", "Frustrated", "Very angry"],
    },
    {"type": "score", "instructions": "How urgent is it?", "criteria": ["Can wait", "This week", "Today", "Now"]},
    {"type": "noul", "instructions": "Is an order number mentioned?"},
    {
        "type": "choice",
        "instructions": "What does the customer want?",
        "criteria": {"a refund": None, "an explanation": None, "a discount": None, "nothing": None},
    },
]
STATES = [
    "I was charged twice for my March invoice (order #4471) and the refund still hasn't arrived. Fix it today.",
    "The app crashes every time I open the settings page since yesterday's update. Please help.",
    "Could you tell me what the enterprise plan costs for 40 seats? We might upgrade next quarter.",
    "My parcel was supposed to arrive on Monday; it is Thursday now and tracking shows nothing.",
    "Thanks for the quick fix last week, everything works. Can I get the invoice as a PDF?",
    "I have emailed three times about my cancelled subscription still being billed. This is unacceptable.",
    "Hola, ¿pueden ayudarme a cambiar la dirección de envío de mi pedido 8812?",
    "Your outage cost us a day of sales. We expect a credit on this month's bill.",
]


async def post(session: aiohttp.ClientSession, url: str, state: str, questions: dict) -> dict:
    body = {"model": "jev-latest", "state": state, "questions": questions}
    async with session.post(url + "/v1/systemone", json=body) as response:
        payload = await response.json()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {json.dumps(payload)[:300]}")
        return payload["answers"]


def vector(answer: dict) -> list[float]:
    return [answer["noul"]] if answer["type"] == "noul" else list(answer["probabilities"].values())


async def l3(url: str) -> tuple[int, int]:
    stats = (await get_json(url + "/v1/cache/stats"))["levels"]["l3"]
    return stats["hits"], stats["misses"]


async def run(args: argparse.Namespace) -> dict:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    questions = {f"q{i}": q for i, q in enumerate(QUESTIONS[: args.questions])}
    states = STATES[: args.states]
    env = {**model_env(args.model, out_dir, args.model_path), "JEV_REDIS_URL": args.redis_url}
    async with Stack(out_dir / "logs-questions") as stack:
        worker = await stack.worker("questions", **env)
        await stack.wait_healthy(timeout_s=300)
        times: dict[str, list[float]] = {"many": [], "one": []}
        answers: dict[str, dict] = {"many": {}, "one": {}}
        hits = {"many": [0, 0], "one": [0, 0]}
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for round_ in range(args.rounds):
                order = ("many", "one") if round_ % 2 == 0 else ("one", "many")
                for arm in order:
                    for state in states:
                        # a fresh variant of each state per round and arm, so both start on a cold L3
                        text = f"[{arm} {round_}] {state}"
                        before = await l3(worker.url)
                        started = time.perf_counter()
                        if arm == "one":
                            got = await post(session, worker.url, text, questions)
                        else:
                            got = {}
                            for qid, question in questions.items():
                                got.update(await post(session, worker.url, text, {qid: question}))
                        times[arm].append(time.perf_counter() - started)
                        after = await l3(worker.url)
                        hits[arm][0] += after[0] - before[0]
                        hits[arm][1] += after[1] - before[1]
            # untimed: the same text both ways must give the same answers (rows never see each other)
            for s, state in enumerate(states):
                text = f"[check] {state}"
                answers["one"][s] = await post(session, worker.url, text, questions)
                answers["many"][s] = {}
                for qid, question in questions.items():
                    answers["many"][s].update(await post(session, worker.url, text, {qid: question}))
    n = len(questions)
    report = {
        "questions_per_state": n,
        "states": len(states),
        "rounds": args.rounds,
        "model": args.model_path or args.model,
    }
    for arm in ("many", "one"):
        total = sum(times[arm])
        h, m = hits[arm]
        report[arm] = {
            "decisions_per_s": n * len(times[arm]) / total,
            "p50_ms": 1000 * statistics.median(times[arm]),
            "p95_ms": 1000 * percentile(sorted(times[arm]), 95),
            "l3_hit_rate": h / (h + m) if h + m else None,
            "l3_hits": h,
            "l3_misses": m,
        }
    report["ratio_decisions_per_s"] = report["one"]["decisions_per_s"] / report["many"]["decisions_per_s"]
    report["max_abs_dp_one_vs_many"] = max(
        abs(a - b)
        for s in range(len(states))
        for qid in questions
        for a, b in zip(vector(answers["one"][s][qid]), vector(answers["many"][s][qid]))
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--states", type=int, default=6)
    parser.add_argument("--questions", type=int, default=8, choices=range(1, len(QUESTIONS) + 1))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    path = Path(args.out) / "questions_per_request.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    n = report["questions_per_state"]
    print(f"{n} questions about each of {report['states']} states x {report['rounds']} rounds, model {report['model']}")
    print(f"{'arm':<34} {'decisions/s':>12} {'p50 ms':>9} {'p95 ms':>9} {'L3 hit rate':>12}")
    for arm, label in (("many", f"{n} requests of 1 question"), ("one", f"1 request of {n} questions")):
        r = report[arm]
        rate = "-" if r["l3_hit_rate"] is None else f"{r['l3_hit_rate']:.2f}"
        print(f"{label:<34} {r['decisions_per_s']:>12.2f} {r['p50_ms']:>9.1f} {r['p95_ms']:>9.1f} {rate:>12}")
    print(f"ratio (one request / {n} requests): x{report['ratio_decisions_per_s']:.2f} decisions/s")
    print(f"answers, one request vs one request per question: max |dp| = {report['max_abs_dp_one_vs_many']:.2e}")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
