"""Drives engine models other than the default one with the official `openai` SDK.

Usage: python engine_models.py BASE_URL API_KEY MODEL...
For each model: a greedy chat completion, the same request streamed (the same text, the
same finish reason, usage), and the listing. Prints one line per check; exits 1 at the
first failure.
"""
import sys

from openai import OpenAI


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        sys.exit(1)


def main():
    base_url, api_key, *models = sys.argv[1:]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    listed = {m.id for m in client.models.list()}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello to the world."}]
    for model in models:
        check(f"{model} listed", model in listed, repr(sorted(listed)))
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        check(f"{model} create", isinstance(text, str) and finish in ("stop", "length"), repr((text, finish)))
        check(f"{model} usage", r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 8, repr(r.usage))
        pieces, streamed_finish, usage = [], None, None
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        for chunk in stream:
            usage = chunk.usage or usage
            for c in chunk.choices:
                pieces.append(c.delta.content or "")
                streamed_finish = c.finish_reason or streamed_finish
        check(f"{model} stream", "".join(pieces) == text and streamed_finish == finish, repr((pieces, text)))
        check(f"{model} stream usage", usage is not None and usage.completion_tokens == r.usage.completion_tokens, repr(usage))


if __name__ == "__main__":
    main()
