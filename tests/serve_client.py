"""The OpenAI Python client against `wgpu-llm serve` (run by tests/serve.rs, which started the
server with --max-batch 2 --max-queue 2 --ctx 512 and compares what this prints with
`wgpu-llm generate`).

usage: serve_client.py BASE_URL   (e.g. http://127.0.0.1:8080)
Prints one JSON object of completions on stdout; exits non-zero on the first failed check.
"""

import json
import sys
import threading
import time
import urllib.request

import openai

BASE = sys.argv[1]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=600)
out = {}

QUESTION = "What is 2+3? Answer briefly."
SAMPLED = dict(temperature=0.8, top_p=0.95, seed=11, extra_body={"top_k": 40, "min_p": 0.05})


def health():
    with urllib.request.urlopen(BASE + "/health", timeout=30) as r:
        return json.load(r)


def chat(content, max_tokens=12, **kw):
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=max_tokens, **kw
    )


def stream_text(content, max_tokens=12, **kw):
    s = chat(content, max_tokens, stream=True, stream_options={"include_usage": True}, **kw)
    text, finish, usage, roles = "", None, None, []
    for chunk in s:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish, usage, roles


# /v1/models lists the model.
models = client.models.list()
assert len(models.data) == 1, models
out["model"] = models.data[0].id

# Chat, greedy and seeded, whole and streamed: the same text both ways.
r = chat(QUESTION, temperature=0)
c = r.choices[0]
assert c.message.role == "assistant" and c.message.content, r
assert c.finish_reason in ("stop", "length"), r
# An unseeded request says the seed it was given.
assert r.system_fingerprint.startswith("seed-"), r
# The prefix cache may give the template's system prompt (an earlier request's), never the whole prompt.
assert 0 <= r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens, r.usage
assert r.usage.completion_tokens >= 1 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
assert r.usage.completion_tokens <= 12
out["chat_greedy"] = c.message.content
out["chat_greedy_usage"] = [r.usage.prompt_tokens, r.usage.completion_tokens]
text, finish, usage, roles = stream_text(QUESTION, temperature=0)
assert text == c.message.content, (text, c.message.content)
assert finish == c.finish_reason and roles == ["assistant"], (finish, roles)
assert usage is not None and [usage.prompt_tokens, usage.completion_tokens] == out["chat_greedy_usage"], usage
r = chat(QUESTION, max_tokens=16, **SAMPLED)
assert r.system_fingerprint == "seed-11", r
out["chat_sampled"] = r.choices[0].message.content
text, _, _, _ = stream_text(QUESTION, max_tokens=16, **SAMPLED)
assert text == out["chat_sampled"], (text, out["chat_sampled"])

# Text completions: greedy, a stop string that cuts the text, echo.
r = client.completions.create(model="m", prompt="The capital of France is", max_tokens=10, temperature=0)
full = r.choices[0].text
assert full and r.usage.prompt_tokens >= 5, r
out["completion_greedy"] = full
stop = full.strip().split()[1] if len(full.strip().split()) > 1 else full.strip()[-1]
r = client.completions.create(
    model="m", prompt="The capital of France is", max_tokens=10, temperature=0, stop=[stop]
)
cut = r.choices[0].text
assert r.choices[0].finish_reason == "stop" and stop not in cut and full.startswith(cut + stop), (full, cut, stop)
parts = [
    ch.choices[0].text
    for ch in client.completions.create(
        model="m", prompt="The capital of France is", max_tokens=10, temperature=0, stream=True
    )
    if ch.choices
]
assert "".join(parts) == full, (parts, full)
r = client.completions.create(model="m", prompt="Hello", max_tokens=2, temperature=0, echo=True)
assert r.choices[0].text.startswith("Hello"), r

# Concurrent requests (two decoded together, two queued) give each its text alone.
prompts = ["Name a color.", "Name a fruit.", "Count to three.", "Say hi."]
alone = {p: chat(p, max_tokens=10, **SAMPLED).choices[0].message.content for p in prompts}
together, errors = {}, []


def worker(p):
    try:
        together[p] = chat(p, max_tokens=10, **SAMPLED).choices[0].message.content
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(repr(e))


threads = [threading.Thread(target=worker, args=(p,)) for p in prompts]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
assert together == alone, (together, alone)
out["concurrent"] = together

# A client that goes away mid-stream frees its sequence; the server answers afterwards.
s = chat("Write a long story about a dragon.", max_tokens=400, temperature=0, stream=True)
got = 0
for chunk in s:
    got += 1
    if got == 3:
        break
s.close()
deadline = time.time() + 60
while health()["active"] != 0:
    assert time.time() < deadline, health()
    time.sleep(0.2)
assert chat(QUESTION, temperature=0).choices[0].message.content == out["chat_greedy"]

# Bad requests: OpenAI's error shape with a 400, named parameter or code.
for kw, param in [
    (dict(temperature=5), "temperature"),
    (dict(top_p=0), "top_p"),
    (dict(n=3), "n"),  # above --max-batch 2
    (dict(max_tokens=0), "max_tokens"),
]:
    args = dict(max_tokens=4)
    args.update(kw)
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], **args)
        raise AssertionError(f"{kw} was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == param, (kw, e.body)
try:
    client.completions.create(model="m", prompt="word " * 600, max_tokens=4)
    raise AssertionError("a prompt beyond the context was accepted")
except openai.BadRequestError as e:
    assert e.body["code"] == "context_length_exceeded", e.body

# The queue's limit: of six long requests at once, two decode, two wait, the rest get 429.
codes, lock = [], threading.Lock()


def long_request(i):
    try:
        chat(f"Tell me about the number {i}.", max_tokens=48, temperature=0)
        code = 200
    except openai.RateLimitError as e:
        code = e.status_code
    except Exception as e:  # noqa: BLE001
        code = repr(e)
    with lock:
        codes.append(code)


threads = [threading.Thread(target=long_request, args=(i,)) for i in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert sorted(codes, key=str).count(200) >= 4 and 429 in codes and set(codes) <= {200, 429}, codes
out["queue_codes"] = sorted(codes)
# A response can reach its client a few engine steps before its sequence is retired (the
# pipelined loop drains the steps in flight): the server settles to idle on its own, promptly.
deadline = time.time() + 10
while (h := health())["active"] or h["queued"] or h["free_sequences"] != 2:
    assert time.time() < deadline, f"the server did not settle to idle: {h}"
    time.sleep(0.05)
assert h["status"] == "ok" and h["free_sequences"] == 2, h
assert chat(QUESTION, temperature=0).choices[0].message.content == out["chat_greedy"]

print(json.dumps(out))
