"""Tool calls round-tripped with the `openai` Python client against `wgpu-llm serve` (run by
tests/tools.rs): a tool definition in, a `tool_calls` message out (tool_choice "required", so the
grammar forces a valid call), the tool's result sent back, a final answer; the same call
streamed; `n` > 1 (each choice is the n = 1 answer of seed + index), whole and streamed; and
the 400s of bad tool requests.

usage: openai_roundtrip.py WGPU_LLM_BINARY MODEL
Starts the server itself (--max-batch 2 --ctx 1024 on a free port), stops it at the end. Exits
non-zero on the first failed check; a missing `openai` package is a failure, never a skip.
"""

import json
import subprocess
import sys

try:
    import openai
except ImportError:
    sys.exit("the `openai` Python package is missing: run tools/install-test-deps.sh (pip install openai)")

BIN, MODEL = sys.argv[1], sys.argv[2]
server = subprocess.Popen(
    [BIN, "serve", "--model", MODEL, "--port", "0", "--ctx", "1024", "--max-batch", "2"],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
)


def base_url():
    seen = []
    for line in server.stderr:
        seen.append(line)
        if line.startswith("listening on "):
            return line.split("listening on ", 1)[1].strip()
    sys.exit("the server stopped before listening:\n" + "".join(seen))


try:
    BASE = base_url()
    client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=900)

    WEATHER = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    TIME = {
        "type": "function",
        "function": {"name": "get_time", "description": "The time now", "parameters": {"type": "object", "properties": {}}},
    }
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = dict(
        model="m", tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, max_tokens=48, temperature=0
    )

    # 1. A tool definition in, a tool_calls message out.
    r = client.chat.completions.create(messages=question, **forced)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", r
    msg = c.message
    assert msg.content is None, msg
    assert len(msg.tool_calls) == 1, msg
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name in ("get_weather", "get_time"), call
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 12, args
    print("call:", call.function.name, call.function.arguments, file=sys.stderr)

    # The same call streamed: the name first, then the arguments in fragments; no tag as content.
    s = client.chat.completions.create(messages=question, stream=True, **forced)
    calls, content, finish = {}, "", None
    for chunk in s:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                if tc.id is not None:
                    assert tc.index not in calls, chunk
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""}
                else:
                    assert tc.function.name is None, chunk
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    assert content == "" and finish == "tool_calls", (content, finish)
    assert list(calls) == [0], calls
    assert calls[0]["name"] == call.function.name, calls
    assert json.loads(calls[0]["arguments"]) == args, calls

    # A named function: that one is called.
    named = dict(forced, tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=40)
    r = client.chat.completions.create(messages=question, **named)
    assert [t.function.name for t in r.choices[0].message.tool_calls] == ["get_weather"], r
    json.loads(r.choices[0].message.tool_calls[0].function.arguments)

    # 2. The tool's result sent back (the assistant message as the client returned it), a final answer.
    history = question + [
        msg,
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "sky": "sunny"})},
    ]
    r = client.chat.completions.create(
        model="m", messages=history, tools=[WEATHER, TIME], max_tokens=12, temperature=0
    )
    final = r.choices[0]
    assert final.message.tool_calls is None and final.message.content, final
    assert final.finish_reason in ("stop", "length"), final
    print("final:", repr(final.message.content), file=sys.stderr)

    # 3. n > 1: choice i is the n = 1 answer with seed + i; usage sums the choices' tokens.
    sampled = dict(model="m", messages=question, max_tokens=6, temperature=0.9, seed=41)
    r = client.chat.completions.create(n=2, **sampled)
    assert [c.index for c in r.choices] == [0, 1], r
    alone = [client.chat.completions.create(**dict(sampled, seed=41 + i)) for i in range(2)]
    assert [c.message.content for c in r.choices] == [a.choices[0].message.content for a in alone], (r, alone)
    assert r.usage.prompt_tokens == alone[0].usage.prompt_tokens, r.usage
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone), (r.usage, alone)
    texts, finishes = {}, {}
    for chunk in client.chat.completions.create(n=2, stream=True, stream_options={"include_usage": True}, **sampled):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens == r.usage.completion_tokens, chunk.usage
    assert [texts[0], texts[1]] == [c.message.content for c in r.choices], (texts, r)
    assert sorted(finishes) == [0, 1], finishes

    # 4. Bad requests: OpenAI's error shape, a 400 naming the problem.
    def refused(param, says, **kw):
        try:
            client.chat.completions.create(model="m", messages=question, max_tokens=4, **kw)
        except openai.BadRequestError as e:
            err = e.body
            assert err["param"] == param and says in err["message"], (param, says, err)
            return
        raise AssertionError(f"not refused: {kw}")

    refused("tool_choice", "'nope'", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    refused("tool_choice", "no tools", tool_choice="required")
    refused("tools", "'bad name'", tools=[{"type": "function", "function": {"name": "bad name"}}])
    refused("response_format", "together", tools=[WEATHER], response_format={"type": "json_object"})
    refused("n", "at most 2", n=3)
    bad_schema = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/$defs/nowhere"}}}
    refused("tools", "'f'", tools=[bad_schema], tool_choice="required")
    try:
        client.completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"tools": [WEATHER]})
        raise AssertionError("tools on /v1/completions were not refused")
    except openai.BadRequestError as e:
        assert e.body["param"] == "tools", e.body
    print("ok", file=sys.stderr)
finally:
    server.kill()
    server.wait()
