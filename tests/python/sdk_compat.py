"""Drives a running crossguard with the official `openai` Python SDK, unchanged.

Usage: python sdk_compat.py BASE_URL API_KEY MODEL
Exits 0 when every check passes; prints one line per check.
"""
import sys

import openai
from openai import OpenAI


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        sys.exit(1)


def main():
    base_url, api_key, model = sys.argv[1:4]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": "hello sdk"}]

    r = client.chat.completions.create(model=model, messages=messages)
    check("create", r.choices[0].message.content == "Echo: hello sdk", repr(r.choices[0].message.content))
    check("create.usage", r.usage is not None and r.usage.total_tokens > 0)

    pieces, finish = [], None
    stream = client.chat.completions.create(
        model=model, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    usage = None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            finish = c.finish_reason or finish
    check("create(stream=True)", "".join(pieces) == "Echo: hello sdk" and finish == "stop", repr(pieces))
    check("stream usage", usage is not None and usage.total_tokens > 0)

    models = [m.id for m in client.models.list()]
    check("models.list", model in models, repr(models))
    check("models.retrieve", client.models.retrieve(model).id == model)

    expectations = [
        ("400 -> BadRequestError", openai.BadRequestError,
         lambda: client.chat.completions.create(model=model, messages=[], temperature=0.5)),
        ("401 -> AuthenticationError", openai.AuthenticationError,
         lambda: OpenAI(base_url=base_url, api_key="sk-not-a-key", max_retries=0).chat.completions.create(
             model=model, messages=messages)),
        ("404 -> NotFoundError", openai.NotFoundError,
         lambda: client.chat.completions.create(model="no-such-model", messages=messages)),
    ]
    for name, exc, call in expectations:
        try:
            call()
            check(name, False, "no exception")
        except exc as e:
            check(name, isinstance(e.body, dict) and "message" in e.body, repr(e.body))

    try:
        for _ in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "#die"}], stream=True):
            pass
        check("mid-stream failure raises", False, "no exception")
    except openai.APIError as e:
        check("mid-stream failure raises", True, type(e).__name__)


if __name__ == "__main__":
    main()
