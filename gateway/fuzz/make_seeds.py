#!/usr/bin/env python3
"""Writes the seed corpora of the gateway's fuzz targets from the shapes the tests use.

    python3 gateway/fuzz/make_seeds.py gateway/fuzz/corpus

sse/: upstream event streams as OpenAI-compatible servers send them (the mock upstream's
frames, usage and tool-call chunks, keep-alive comments, CRLF and bare-CR line ends, an
error event, a stream cut mid-event). The first byte of each seed is the target's chunking
seed. chat_request/: request bodies from the API tests (every optional field, content
parts, tool calls, stream options). scripts/fuzz.sh with FUZZ_MERGE=1 minimises both.
"""
import json
import pathlib
import sys


def chunk(choices, **extra):
    return {"id": "mock-1", "object": "chat.completion.chunk", "created": 1, "model": "mock", "choices": choices, **extra}


def delta(text, index=0, finish=None):
    return {"index": index, "delta": {"content": text}, "finish_reason": finish}


def frames(events, end="\n"):
    return "".join(f"data: {json.dumps(e, separators=(',', ':'))}{end}{end}" for e in events)


def sse_seeds():
    words = [delta("Hello"), delta(" there"), delta("!", finish="stop")]
    tool = chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\":"}}]}, "finish_reason": None}])
    usage = chunk([], usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
    plain = frames([chunk([d]) for d in words]) + "data: [DONE]\n\n"
    return {
        "plain": plain,
        "crlf": frames([chunk([d]) for d in words], "\r\n") + "data: [DONE]\r\n\r\n",
        "bare-cr": frames([chunk([words[0]])], "\r") + "data: [DONE]\r\r",
        "comments": ": keep-alive\n\nevent: message\nid: 7\nretry: 100\n" + frames([chunk([words[0]])]),
        "multiline": "data: {\"a\":\ndata: 1}\n\ndata:no-space\n\ndata\n\n",
        "tool-usage": frames([tool, usage]) + "data: [DONE]\n\n",
        "n2": frames([chunk([delta("a", 0), delta("b", 1)])]),
        "error": "event: error\ndata: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n",
        "cut": plain[: len(plain) // 2],
        "utf8": frames([chunk([delta("déjà vu — 日本語 🙂")])]),
    }


def request_seeds():
    user = {"role": "user", "content": "hi"}
    return {
        "minimal": {"model": "m", "messages": [user]},
        "stream-usage": {"model": "m", "messages": [user], "stream": True, "stream_options": {"include_usage": True}},
        "sampling": {"model": "m", "messages": [user], "temperature": 0.7, "top_p": 0.9, "seed": -3, "n": 2,
                     "max_tokens": 16, "max_completion_tokens": 20, "presence_penalty": 1.5,
                     "frequency_penalty": -0.5, "stop": ["END", "\n\n"], "user": "u-1"},
        "logprobs": {"model": "m", "messages": [user], "logprobs": True, "top_logprobs": 2, "logit_bias": {"50256": -100, "7": 2.5}},
        "conversation": {"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image_url", "image_url": {"url": "data:,"}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"q\":1}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "result text"},
            {"role": "developer", "content": ""}]},
        "tools": {"model": "m", "messages": [user], "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
                  "tool_choice": "auto", "reasoning_effort": "low"},
        "bad-param": {"model": "m", "messages": [{"role": "robot", "content": 5}], "n": 0, "stop": ""},
        "nulls": {"model": "m", "messages": [user], "temperature": None, "stream_options": None, "tools": None},
    }


def main(out):
    out = pathlib.Path(out)
    (out / "sse").mkdir(parents=True, exist_ok=True)
    (out / "chat_request").mkdir(parents=True, exist_ok=True)
    for i, (name, text) in enumerate(sse_seeds().items()):
        (out / "sse" / f"seed-{name}").write_bytes(bytes([i * 37 % 256]) + text.encode())
    for name, body in request_seeds().items():
        (out / "chat_request" / f"seed-{name}.json").write_text(json.dumps(body))


if __name__ == "__main__":
    main(sys.argv[1])
