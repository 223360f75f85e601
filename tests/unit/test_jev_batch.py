"""`jev batch` (services/jev/batch): its three input forms, the state window, the adaptive concurrency, the output
and its resume (SIGKILL mid-run included), the progress line and the exit status, against a recording stand-in
for the frontend. tests/stack/test_doc_examples.py runs it against the real stack."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from jev import cli
from jev.batch.inputs import CsvSpec, InputError, count_lines, read_csv, read_jsonl
from jev.batch.output import InOrder, OutputError, ResultFile, done_ids
from jev.batch.pacing import Pacer
from jev.batch.progress import Progress, Tally
from jev.batch.runner import BatchOptions, BatchRun, errors_path_for
from jev.batch.window import StateWindow

ROOT = Path(__file__).resolve().parents[2]


def request(state: str, question: str, model: str | None = "jev-latest") -> dict:
    body = {"state": state, "questions": {"q": {"type": "noul", "instructions": question}}}
    return body if model is None else {"model": model, **body}


def batch_line(custom_id: str, state: str, question: str) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/systemone", "body": request(state, question)}


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def output_ids(path: Path) -> list[str]:
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines()] if path.exists() else []


class StandIn:
    """The frontend's /v1/systemone, recording what it gets: the body, the headers, and the order of arrival. Every
    answer is a noul per question; `script[question]` is a list of statuses answered first (then 200); `delay_s`
    per request; the L3 outcome is `hit` for a state seen before."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.script: dict[str, list[int]] = {}
        self.received: list[dict] = []
        self.headers: list[dict] = []
        self.states: set[str] = set()
        self.in_flight = self.max_in_flight = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(body)
        self.headers.append(dict(request.headers))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            question = json.dumps(body.get("questions"))
            statuses = next((s for key, s in self.script.items() if key in question), None)
            if statuses:
                status = statuses.pop(0)
                detail = {"error_type": "overloaded" if status in (429, 503) else "validation_error", "message": "no"}
                return web.json_response({"detail": detail}, status=status, headers={"Retry-After": "0"})
            state = json.dumps(body.get("state"))
            l3 = "hit" if state in self.states else "miss"
            self.states.add(state)
            answers = {qid: {"type": "noul", "noul": 0.25} for qid in body["questions"]}
            return web.json_response(
                {"model": body.get("model"), "answers": answers, "usage": {"input_tokens": 9, "output_tokens": 0}},
                headers={"x-jev-cache": f"l1=miss,l3={l3}", "x-typesafe-request-id": f"req_{len(self.received)}"},
            )
        finally:
            self.in_flight -= 1

    @contextlib.asynccontextmanager
    async def serve(self):
        app = web.Application()
        app.router.add_post("/v1/systemone", self.handle)
        server = TestServer(app)
        await server.start_server()
        try:
            yield str(server.make_url("")).rstrip("/")
        finally:
            await server.close()


def options(tmp_path: Path, input_path: Path, url: str, **overrides) -> BatchOptions:
    output = str(tmp_path / "out.jsonl")
    base = dict(input=str(input_path), output=output, errors=errors_path_for(output), url=url, progress=False)
    return BatchOptions(**(base | overrides))


async def run(opts: BatchOptions) -> tuple[int, str]:
    stderr = io.StringIO()
    code = await BatchRun(opts, stderr).run()
    return code, stderr.getvalue()


# ----- the input forms -------------------------------------------------------------------------------------------


def test_batch_lines_are_read_as_sent_and_bad_lines_say_why():
    text = "\n".join(
        [
            json.dumps(batch_line("a", "s", "q?")),
            "",
            json.dumps({"custom_id": "b", "body": request("s", "r?", model=None)}),  # method and url may be left out
            "{not json",
            json.dumps({"custom_id": "", "body": request("s", "q?")}),
            json.dumps({"custom_id": "c", "url": "/v1/chat/completions", "body": {}}),
            json.dumps({"custom_id": "d", "method": "GET", "body": request("s", "q?")}),
            json.dumps({"custom_id": "e", "body": "text"}),
            json.dumps(request("s", "plain?")),  # a plain request in a batch-line file is not one
        ]
    )
    lines = list(read_jsonl(io.StringIO(text), model="fill-in"))
    assert [(line.number, line.custom_id, line.body is not None) for line in lines] == [
        (1, "a", True),
        (3, "b", True),
        (4, "line-4", False),
        (5, "line-5", False),
        (6, "c", False),
        (7, "d", False),
        (8, "e", False),
        (9, "line-9", False),
    ]
    assert lines[0].body == request("s", "q?") and lines[1].body["model"] == "fill-in"
    errors = [line.error for line in lines[2:]]
    assert "not JSON" in errors[0] and "custom_id" in errors[1] and "/v1/chat/completions" in errors[2]
    assert "GET" in errors[3] and "body" in errors[4] and "custom_id" in errors[5]


def test_plain_requests_are_named_by_their_line_number():
    text = json.dumps(request("s", "a?")) + "\n\n" + json.dumps(request("t", "b?", model=None)) + "\n[1]\n"
    lines = list(read_jsonl(io.StringIO(text), model="m"))
    assert [(line.custom_id, line.body is not None) for line in lines] == [
        ("line-1", True),
        ("line-3", True),
        ("line-4", False),
    ]
    assert lines[1].body["model"] == "m" and lines[0].group != lines[1].group


def test_csv_rows_become_requests_with_the_questions_file(tmp_path):
    questions = {"spam": {"type": "noul", "instructions": "Is it spam?"}}
    (tmp_path / "q.json").write_text(json.dumps(questions))
    table = 'id,title,body\nt1,Hello,"Buy now,\ncheap"\nt2,Hi,See you\n'
    one = CsvSpec.load(str(tmp_path / "q.json"), ["body"], "id", "m")
    rows = list(read_csv(io.StringIO(table), one))
    assert [(r.custom_id, r.body) for r in rows] == [
        ("t1", {"model": "m", "state": "Buy now,\ncheap", "questions": questions}),
        ("t2", {"model": "m", "state": "See you", "questions": questions}),
    ]
    rest = list(read_csv(io.StringIO(table), CsvSpec(questions, (), None)))  # every column the state, ids row-N
    assert [r.custom_id for r in rest] == ["row-1", "row-2"]
    assert rest[1].body["state"] == {"id": "t2", "title": "Hi", "body": "See you"}
    with pytest.raises(InputError, match="no column 'text'"):
        list(read_csv(io.StringIO(table), CsvSpec(questions, ("text",))))
    (tmp_path / "t.csv").write_text(table)
    assert count_lines(str(tmp_path / "t.csv"), csv_rows=True) == 2
    (tmp_path / "request.json").write_text(json.dumps({"questions": questions}))  # a request-shaped file too
    assert CsvSpec.load(str(tmp_path / "request.json"), [], None, "m").questions == questions
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(InputError, match="questions"):
        CsvSpec.load(str(tmp_path / "bad.json"), [], None, "m")


# ----- the window, the pacing, the output ------------------------------------------------------------------------


def test_the_window_sends_a_state_whole_then_the_oldest_next():
    from jev.batch.inputs import Line

    window = StateWindow(limit=5)
    for seq, state in enumerate("ABACB"):
        window.add(seq, Line(seq + 1, f"{state}{seq}", request(state, "q?")))
    assert window.full
    sent = [window.pop()[1].custom_id]
    window.add(5, Line(6, "A5", request("A", "q?")))  # read while A is being sent: joins it
    sent += [window.pop()[1].custom_id for _ in range(3)]
    window.add(6, Line(7, "A6", request("A", "q?")))  # A was sent whole: a new group, after the older ones
    sent += [window.pop()[1].custom_id for _ in range(len(window))]
    assert sent == ["A0", "A2", "A5", "B1", "B4", "C3", "A6"]


async def test_the_pacer_halves_once_per_round_trip_grows_back_and_holds_on_503():
    now = [0.0]
    pacer = Pacer(8, clock=lambda: now[0])
    sent = [await pacer.acquire() for _ in range(8)]
    assert pacer.in_flight == 8
    for at in sent:  # eight 429s to requests sent before the cut: one cut
        pacer.release()
        pacer.overloaded(at)
    assert pacer.limit == 4 and pacer.lowest == 4
    for _ in range(100):
        pacer.succeeded()
    assert pacer.limit == 8  # never past the maximum
    now[0] = 1.0
    pacer.overloaded(await pacer.acquire(), hold_s=0.2)  # a 503 after the cut: cut again, and hold
    pacer.release()
    assert pacer.limit == 4
    waiting = asyncio.ensure_future(pacer.acquire())
    await asyncio.sleep(0.05)
    now[0] = 1.3
    assert await asyncio.wait_for(waiting, 2) == 1.3


def test_resume_cuts_a_cut_short_last_line_and_refuses_a_foreign_file(tmp_path):
    out = tmp_path / "out.jsonl"
    good = '{"id":"x","custom_id":"a","response":null,"error":null}\n'
    out.write_text(good + '{"id":"y","custom_id":"b","resp')
    results = ResultFile(str(out))
    assert results.open_for_resume() == {"a"}
    assert out.read_text() == good
    with pytest.raises(OutputError, match="another jev batch"):
        ResultFile(str(out)).open_for_resume()  # one writer at a time
    results.close()
    out.write_text(good + "not a line\n" + good)
    with pytest.raises(OutputError, match="line 2 is not a batch output line"):
        done_ids(str(out))
    out.write_text(good + "[1]\n")  # a complete last line that is no output line: cut too
    assert done_ids(str(out)) == ({"a"}, len(good))


def test_in_order_holds_lines_until_the_earlier_ones_are_final():
    written = []
    order = InOrder(written.append)
    order.done(2, {"n": 2})
    order.done(0, {"n": 0})
    assert written == [{"n": 0}] and order.held == 1
    order.done(1, None)  # failed: nothing written for it
    assert written == [{"n": 0}, {"n": 2}] and order.next == 3


def test_progress_shows_rate_eta_errors_and_l3():
    tally = Tally(total=100, earlier=10, ok=30, failed=2, started=0.0)
    for header in ("l1=hit,l3=hit", "l3=miss", "l3=hit", "l3=off", None):
        tally.l3(header)
    progress = Progress(tally, io.StringIO(), tty=False, unicode=False)
    line = progress.render(in_flight=4, now=16.0)
    assert "42/100" in line and "42.0%" in line and "2.0/s" in line and "ETA 29s" in line
    assert "errors 2" in line and "L3 hit 67%" in line and "in flight 4" in line and "[##########" in line


# ----- whole runs against the stand-in ---------------------------------------------------------------------------


async def test_every_line_of_a_batch_file_is_answered_a_state_at_a_time(tmp_path):
    stand_in = StandIn(delay_s=0.01)
    rows = [batch_line(f"s{s}-q{q}", f"state {s}", f"question {q}?") for q in range(4) for s in range(5)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    async with stand_in.serve() as url:
        code, said = await run(options(tmp_path, source, url, api_key="k1", concurrency=4))
    assert code == 0, said
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(r["custom_id"] for r in rows)
    first = out[0]
    assert set(first) == {"id", "custom_id", "response", "error"} and first["error"] is None
    assert first["id"].startswith("batch_req_") and first["response"]["status_code"] == 200
    assert first["response"]["request_id"].startswith("req_") and first["response"]["body"]["answers"]["q"]
    assert all(h["x-jev-priority"] == "bulk" and h["Authorization"] == "Bearer k1" for h in stand_in.headers)
    sent_states = [body["state"] for body in stand_in.received]
    assert sent_states == sorted(sent_states, key=lambda s: int(s.split()[1]))  # a state's four together
    assert stand_in.max_in_flight <= 4
    assert "20 lines" in said and "L3 hit 75.0% (15 of 20)" in said
    assert not (tmp_path / "out.errors.jsonl").exists()


async def test_plain_requests_and_csv_rows_are_answered(tmp_path):
    stand_in = StandIn()
    plain = write_jsonl(tmp_path / "plain.jsonl", [request(f"state {i}", "q?") for i in range(3)])
    table = tmp_path / "t.csv"
    table.write_text("id,text\na,first\nb,second\n")
    (tmp_path / "q.json").write_text(json.dumps({"x": {"type": "noul", "instructions": "Is it?"}}))
    async with stand_in.serve() as url:
        code, said = await run(options(tmp_path, plain, url))
        assert code == 0, said
        assert sorted(output_ids(tmp_path / "out.jsonl")) == ["line-1", "line-2", "line-3"]
        spec = CsvSpec.load(str(tmp_path / "q.json"), ["text"], "id", "jev-latest")
        code, said = await run(options(tmp_path, table, url, output=str(tmp_path / "csv.jsonl"), csv=spec))
        assert code == 0, said
    assert sorted(output_ids(tmp_path / "csv.jsonl")) == ["a", "b"]
    assert {"model": "jev-latest", "state": "second", "questions": spec.questions} in stand_in.received


async def test_overload_is_retried_and_failures_go_to_the_errors_file_with_exit_1(tmp_path):
    stand_in = StandIn()
    stand_in.script = {"busy": [429, 503], "bad": [422, 422, 422]}
    rows = [batch_line("ok", "s", "fine?"), batch_line("busy", "s", "busy?"), batch_line("bad", "s", "bad?")]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n" + json.dumps(rows[0]) + "\n")
    async with stand_in.serve() as url:
        code, said = await run(options(tmp_path, source, url, concurrency=2))
    assert code == 1, said
    assert sorted(output_ids(tmp_path / "out.jsonl")) == ["busy", "ok"]
    errors = {e["custom_id"]: e for e in map(json.loads, (tmp_path / "out.errors.jsonl").read_text().splitlines())}
    assert set(errors) == {"bad", "line-4", "ok"}
    assert errors["bad"]["response"]["status_code"] == 422 and errors["bad"]["error"] is None  # not retried
    assert errors["line-4"]["response"] is None and errors["line-4"]["error"]["code"] == "invalid_line"
    assert errors["ok"]["error"]["code"] == "duplicate_custom_id"
    assert sum("busy" in json.dumps(b) for b in stand_in.received) == 3  # 429, 503, then answered
    assert "2 retries" in said and "3 failed" in said


async def test_a_lost_connection_is_retried_then_reported(tmp_path):
    from tests.fakes.net import closed_port

    source = write_jsonl(tmp_path / "in.jsonl", [batch_line("a", "s", "q?")])
    code, said = await run(options(tmp_path, source, f"http://127.0.0.1:{closed_port()}", max_retries=1))
    assert code == 1
    (error,) = map(json.loads, (tmp_path / "out.errors.jsonl").read_text().splitlines())
    assert error["error"]["code"] == "request_failed" and "after 2 attempts" in error["error"]["message"]


async def test_ordered_output_follows_the_input_whatever_finishes_first(tmp_path):
    stand_in = StandIn()
    stand_in.script = {"slow": [503]}  # the first line is answered last
    rows = [batch_line("slow", "a", "slow?")] + [batch_line(f"n{i}", f"s{i}", "q?") for i in range(6)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    async with stand_in.serve() as url:
        code, said = await run(options(tmp_path, source, url, ordered=True, window=3))
    assert code == 0, said
    assert output_ids(tmp_path / "out.jsonl") == [r["custom_id"] for r in rows]


async def test_a_rerun_sends_only_what_output_lacks_and_redoes_a_cut_short_line(tmp_path):
    stand_in = StandIn()
    rows = [batch_line(f"id{i}", f"s{i % 3}", f"q{i}?") for i in range(9)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    earlier = [{"id": "x", "custom_id": f"id{i}", "response": {"status_code": 200}, "error": None} for i in (0, 4)]
    out.write_text("".join(json.dumps(e) + "\n" for e in earlier) + '{"id":"y","custom_id":"id5","resp')
    async with stand_in.serve() as url:
        code, said = await run(options(tmp_path, source, url))
    assert code == 0, said
    assert sorted(q for b in stand_in.received for q in [b["questions"]["q"]["instructions"]]) == sorted(
        f"q{i}?" for i in range(9) if i not in (0, 4)
    )
    ids = output_ids(out)
    assert sorted(ids) == sorted(r["custom_id"] for r in rows) and len(ids) == len(set(ids))
    assert "2 skipped" in said


async def test_sigkill_mid_run_loses_no_written_line_and_sends_none_again(tmp_path):
    """kill -9 while 4 requests are in flight, then the same command again: every custom_id once in OUTPUT, none
    that was written sent again, the ones in flight at the kill sent again."""
    stand_in = StandIn(delay_s=0.05)
    rows = [batch_line(f"id{i}", f"state {i // 4}", f"q{i}?") for i in range(80)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'services'}:{ROOT}")

    async def start(url: str):
        argv = ["-m", "jev", "batch", str(source), "-o", str(out), "--url", url, "--concurrency", "4"]
        return await asyncio.create_subprocess_exec(
            sys.executable, *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )

    def sent_ids(bodies) -> set[str]:
        return {f"id{b['questions']['q']['instructions'][1:-1]}" for b in bodies}

    async with stand_in.serve() as url:
        first = await start(url)
        deadline = time.monotonic() + 60
        while len(output_ids(out)) < 20:
            assert time.monotonic() < deadline and first.returncode is None, "the first run wrote too little"
            await asyncio.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
        written = set(output_ids(out))
        in_flight = sent_ids(stand_in.received) - written
        assert in_flight, "nothing was in flight at the kill"
        before = len(stand_in.received)
        second = await start(url)
        _, stderr = await asyncio.wait_for(second.communicate(), 120)
        assert second.returncode == 0, stderr.decode()[-2000:]
    resent = sent_ids(stand_in.received[before:])
    assert not resent & written  # nothing written was sent again
    assert in_flight <= resent  # what was in flight was
    ids = output_ids(out)
    assert len(ids) == len(set(ids)) == 80 and set(ids) == {r["custom_id"] for r in rows}


# ----- the command line ------------------------------------------------------------------------------------------


def test_the_command_line_refuses_what_it_cannot_run(tmp_path, capsys):
    table = tmp_path / "t.csv"
    table.write_text("a\n1\n")
    assert cli.main(["batch", str(table), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "needs --questions" in capsys.readouterr().err
    assert cli.main(["batch", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli.main(["batch", str(table), "--questions", str(tmp_path / "nope.json"), "-o", "o.jsonl"]) == 2
    assert "questions file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["batch", str(table), "-o", "o.jsonl", "--concurrency", "0"])
    assert errors_path_for("a/out.jsonl") == "a/out.errors.jsonl" and errors_path_for("out") == "out.errors.jsonl"
