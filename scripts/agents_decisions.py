#!/usr/bin/env python3
"""Where the agents' wrong answers were decided: each reply of each wrong
question from a `scripts/agents_eval.py --log` run, its prompt rendered again
from the model file's own chat template, and the first token's top five
log-probabilities on `tern serve` and on a native llama-server for that same
prompt text (no tool grammar on either: the model's own choice).

A reply both servers would open the same way is the model's choice, not the
server's: e.g. the 1.5B answering "3 * 129.99" as text where a call to
multiply would have been right.

The prompt is rendered with Jinja2 as llama.cpp's `--jinja` path renders a
chat request (tool definitions reduced to type, name, description and
parameters; call arguments as objects), which tests/qwen.rs holds Tern's
rendering to byte for byte; each prompt's length in tokens is checked against
the prompt tokens `tern serve` counted for that chat request.

Usage (both servers are started and stopped by the script):
  python3 scripts/agents_decisions.py --model qwen2.5-coder-1.5b-instruct \\
      --llama-server target/llama-native/bin/llama-server \\
      --records records/agents58/qwen2.5-coder-1.5b-instruct.tern.jsonl \\
      --out records/agents58/qwen2.5-coder-1.5b-instruct.decisions.json
(the exchanges log is the records' name with `.exchanges.jsonl`). Add
`--protocol v2` for a v2 run (its instructions and tools) and `--tern PATH`
for the binary that served it; `--last-only` keeps each wrong question's
last reply (the one that ended it), where a run's replies are too many to
score all on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agents_eval as ev  # noqa: E402


def chat_template(gguf: Path) -> str:
    """`tokenizer.chat_template` from a GGUF file's metadata."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{gguf}: not a GGUF file")
        f.read(4)
        _, n_kv = struct.unpack("<QQ", f.read(16))

        def text() -> str:
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        for _ in range(n_kv):
            key = text()
            (kind,) = struct.unpack("<I", f.read(4))
            if kind == 8:
                value = text()
                if key == "tokenizer.chat_template":
                    return value
            elif kind == 9:
                item, n = struct.unpack("<IQ", f.read(12))
                for _ in range(n):
                    text() if item == 8 else f.read(sizes[item])
            else:
                f.read(sizes[kind])
    sys.exit(f"{gguf}: no chat template")


def renderer(source: str):
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    template = env.from_string(source)

    def render(messages: list[dict], tools: list[dict]) -> str:
        msgs = json.loads(json.dumps(messages))
        for m in msgs:
            if m.get("content") is None:
                m["content"] = ""
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        tools = [{"type": "function", "function": {k: t["function"][k] for k in ("name", "description", "parameters")}}
                 for t in tools]
        return template.render(messages=msgs, tools=tools, add_generation_prompt=True)

    return render


def tools_of() -> list[dict]:
    """The tool definitions the eval's agent sends (the SDK's schemas of its
    function tools, key for key; the prompt-token check below confirms them)."""
    schema = {"type": "object", "additionalProperties": False}

    def tool(name: str, doc: str, props: dict) -> dict:
        params = {"properties": props, "required": list(props), "title": f"{name}_args", **schema}
        return {"type": "function", "function": {"name": name, "description": doc, "parameters": params}}

    num = {"type": "number"}
    return [
        tool("lookup_price", "The price in US dollars of one unit of an item from the shop's catalog.",
             {"item": {"title": "Item", "type": "string"}}),
        tool("exchange_rate", "Today's exchange rate: units of to_currency for one unit of from_currency (ISO codes).",
             {"from_currency": {"title": "From Currency", "type": "string"},
              "to_currency": {"title": "To Currency", "type": "string"}}),
        tool("multiply", "Multiplies two numbers.", {"a": {"title": "A", **num}, "b": {"title": "B", **num}}),
        tool("add", "Adds two numbers.", {"a": {"title": "A", **num}, "b": {"title": "B", **num}}),
    ]


def tools_of_protocol(name: str) -> list[dict]:
    """A later protocol's tool definitions, from the SDK's own schemas of the
    eval's function tools, in the order its agent declares them."""
    if name == "v1":
        return tools_of()  # as v1's decisions were computed
    every = ev.make_tools([])
    return [{"type": "function", "function": {"name": n, "description": every[n].description,
                                              "parameters": every[n].params_json_schema}}
            for n in ev.PROTOCOLS[name].tools]


def prompts(records: list[dict], exchanges: list[dict], instructions: str = ev.INSTRUCTIONS) -> list[dict]:
    """Each reply of each wrong question: the conversation before it, as the SDK sent it."""
    wrong = {r["question"] for r in records if not r["right"]}
    out, history = [], {}
    for e in exchanges:
        q = e["question"]
        msgs = history.setdefault(q, [{"role": "system", "content": instructions}])
        if e["turn"] == 0:
            del msgs[1:]
        msgs.append(e["new_message"])
        if q in wrong:
            out.append({"question": q, "turn": e["turn"], "messages": list(msgs), "reply": e["reply"],
                        "tern_prompt_tokens": (e.get("usage") or {}).get("prompt_tokens")})
        if e["reply"]:
            reply = {k: v for k, v in e["reply"].items() if k in ("role", "content", "tool_calls")}
            msgs.append(reply)
    return out


# The first token of a reply that ends the turn without text.
END = "<end of turn>"


def top5(url: str, kind: str, prompt: str) -> dict:
    import httpx2 as httpx

    if kind == "tern":
        body = {"model": httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["id"],
                "prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 5}
        r = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer k"}, timeout=600).json()
        c = r["choices"][0]
        tops = (c.get("logprobs") or {}).get("top_logprobs") or [{}]
        # A reply that ends at once (end of turn) has no text and no logprobs.
        ended = c["text"] == "" and c.get("finish_reason") == "stop"
        return {"prompt_tokens": r["usage"]["prompt_tokens"], "first": END if ended else c["text"],
                "top5": {k: round(v, 3) for k, v in tops[0].items()}}
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "n_probs": 5, "cache_prompt": False}
    r = httpx.post(f"{url}/completion", json=body, headers={"Authorization": "Bearer k"}, timeout=600).json()
    probs = r.get("completion_probabilities") or [{"top_logprobs": []}]
    # Special tokens (end of turn, <tool_call>) have no text here: keyed by
    # id, so they do not collapse into one '' entry.
    return {"prompt_tokens": r.get("tokens_evaluated"),
            "first": END if r.get("stop_type") == "eos" else r["content"],
            "top5": {t["token"] or f"<token {t.get('id')}>": round(t["logprob"], 3)
                     for t in probs[0]["top_logprobs"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(ev.GGUF), required=True)
    ap.add_argument("--llama-server", required=True, help="path of a native llama-server binary")
    ap.add_argument("--records", required=True, help="the run's records (agents_eval.py --out)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--protocol", choices=sorted(ev.PROTOCOLS), default="v1")
    ap.add_argument("--last-only", action="store_true", help="only each wrong question's last reply")
    ap.add_argument("--tern", help="path of the tern binary that served the run (default target/release/tern)")
    args = ap.parse_args()
    records_path = Path(args.records)
    records = [json.loads(x) for x in records_path.read_text().splitlines() if x.strip()]
    log = records_path.with_name(records_path.name.removesuffix(".jsonl") + ".exchanges.jsonl")
    exchanges = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    render = renderer(chat_template(ev.GGUF[args.model]))
    tools = tools_of_protocol(args.protocol)
    items = prompts(records, exchanges, ev.PROTOCOLS[args.protocol].instructions)
    if args.last_only:
        last = {it["question"]: it for it in items}  # the latest turn of each question wins
        items = list(last.values())
    for it in items:
        it["prompt"] = render(it.pop("messages"), tools)
    tmp = Path(tempfile.mkdtemp(prefix="agents-decisions-"))
    for kind in ("tern", "llama"):
        with ev.server(kind, args.model, args.llama_server, tmp / f"{kind}.log", args.tern) as url:
            for it in items:
                it[kind] = top5(url, kind, it["prompt"])
    for it in items:
        it.pop("prompt")
        it["same_first_token"] = it["tern"]["first"] == it["llama"]["first"]
    summary = {
        "model": args.model,
        "records": str(records_path),
        "protocol": args.protocol,
        "replies_scored": "each wrong question's last" if args.last_only else "all of each wrong question",
        "replies": len(items),
        "same_first_token": sum(it["same_first_token"] for it in items),
        # Each re-rendered prompt is as long as the one the chat endpoint built.
        "prompts_equal_chat_prompt_tokens": all(
            it["tern"]["prompt_tokens"] == it["tern_prompt_tokens"] for it in items),
    }
    Path(args.out).write_text(json.dumps({"summary": summary, "replies": items}, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
