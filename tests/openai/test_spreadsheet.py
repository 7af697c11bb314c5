"""The spreadsheet setting at the endpoint (Tern's `spreadsheet` extension on
/v1/chat/completions, sent with the SDK's `extra_body`): the client sends its
own workbooks and an answer position, the served model writes openpyxl
programs, each runs on every workbook in the sandbox, the one whose outputs
the others agree with is chosen, and with `rounds` a program that crashed or
wrote no answer writes again. SmolLM2 cannot write such a program, so what is
checked is what a client sees: every candidate and round reported, one output
(or the reason for none) per workbook sent, and clear errors for bad input.
The judge and the choice themselves are tested in Rust on reference
programs."""

from __future__ import annotations

import base64
import io

import openpyxl
import pytest

from conftest import API_KEY, MODEL, httpx, running_server

CHAT = "/v1/chat/completions"
INSTRUCTION = "Fill Total (column C) with Qty times Price for every row."


def workbook(rows: list[tuple[int, float]]) -> str:
    """A small order sheet as base64 .xlsx: Qty and Price, Total to fill."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Orders"
    sheet.append(["Qty", "Price", "Total"])
    for qty, price in rows:
        sheet.append([qty, price, None])
    out = io.BytesIO()
    book.save(out)
    return base64.b64encode(out.getvalue()).decode()


BOOKS = [
    workbook([(2, 3.5), (1, 10.0), (4, 0.25)]),
    workbook([(7, 1.0), (3, 2.5), (5, 4.0)]),
    workbook([(1, 9.0), (6, 0.5), (2, 8.0)]),
]
SHEET = {"workbooks": BOOKS, "answer_position": "'Orders'!C2:C4"}


@pytest.fixture(scope="module")
def allowed():
    with running_server(MODEL, "smollm2-135m-instruct", ("--allow-code-execution",)) as url:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=600.0) as http:
            name = http.get("/v1/models").json()["data"][0]["id"]
            http.headers["X-Test-Model"] = name
            yield http


def body(model: str, **fields) -> dict:
    b = {
        "model": model,
        "messages": [{"role": "user", "content": INSTRUCTION}],
        "max_tokens": 64,
        "temperature": 0.7,
        "seed": 3,
        "spreadsheet": dict(SHEET),
    }
    b.update(fields)
    return b


def test_candidates_rounds_and_one_output_per_workbook(allowed):
    model = allowed.headers["X-Test-Model"]
    r = allowed.post(CHAT, json=body(model, best_of=2, spreadsheet=dict(SHEET, rounds=2)))
    assert r.status_code == 200, r.text
    out = r.json()
    tern = out["tern"]
    assert tern["best_of"] == 2 and tern["aggregate"] == "agree"
    assert len(tern["candidates"]) == 2
    assert 0 <= tern["chosen"] < 2
    assert out["choices"][0]["message"]["content"]
    # SmolLM2's 64-token programs do not run: shown why, each writes again.
    assert tern["rounds_run"] == 2, tern
    assert len(tern["chosen_by_round"]) == 2
    for c in tern["candidates"]:
        assert c["rounds"] in (1, 2) and c["answered"] <= len(BOOKS)
        assert c["tokens"] > 0 and isinstance(c["program"], str)
    assert any(c["rounds"] == 2 for c in tern["candidates"]), tern
    # Every round's tokens are billed.
    assert out["usage"]["completion_tokens"] == sum(c["tokens"] for c in tern["candidates"])
    # The chosen program's output (or why it has none) for each workbook sent.
    outputs = tern["spreadsheet"]["outputs"]
    assert len(outputs) == len(BOOKS)
    for o in outputs:
        assert set(o) in ({"workbook"}, {"error"}), o
        if "workbook" in o:
            openpyxl.load_workbook(io.BytesIO(base64.b64decode(o["workbook"])))


def test_the_setting_needs_code_execution(http, model_id):
    """The session's server runs without --allow-code-execution: a 403
    naming the field, and nothing runs."""
    r = http.post(CHAT, json=body(model_id))
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["param"] == "spreadsheet" and err["code"] == "code_execution_disabled", err


@pytest.mark.parametrize("fields,param,says", [
    ({"spreadsheet": dict(SHEET, workbooks=["%%%"])}, "spreadsheet.workbooks[0]", "base64"),
    ({"spreadsheet": dict(SHEET, workbooks=[BOOKS[0], base64.b64encode(b"plain text").decode()])},
     "spreadsheet.workbooks[1]", "not a readable"),
    ({"spreadsheet": dict(SHEET, workbooks=[])}, "spreadsheet.workbooks", "1 to 8"),
    ({"spreadsheet": dict(SHEET, answer_position="'Sales'!C2:C4")}, "spreadsheet.answer_position", "no sheet 'Sales'"),
    ({"spreadsheet": dict(SHEET, answer_position="C0")}, "spreadsheet.answer_position", "not a cell address"),
    ({"spreadsheet": dict(SHEET, rounds=11)}, "spreadsheet.rounds", "between 1 and 10"),
    ({"spreadsheet": dict(SHEET, instruction_type="row")}, "spreadsheet.instruction_type", "cell"),
    ({"spreadsheet": dict(SHEET, extra=1)}, "spreadsheet", "unknown field"),
    ({"spreadsheet": {"workbooks": BOOKS}}, "spreadsheet", "answer_position"),
    ({"best_of": 9}, "best_of", "between 1 and 8"),
    ({"stream": True}, "stream", "streaming"),
    ({"aggregate": "majority", "best_of": 2}, "spreadsheet", "agreement"),
    ({"messages": [{"role": "system", "content": "Be brief."}]}, "messages", "last user message"),
])
def test_bad_spreadsheet_requests_are_400s(allowed, fields, param, says):
    model = allowed.headers["X-Test-Model"]
    r = allowed.post(CHAT, json=body(model, **fields))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err
    ok = allowed.post(CHAT, json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert ok.status_code == 200, ok.text
