"""The official `openai` SDK's Responses API against a gateway whose model is a scripted
upstream (tests/src/mock_upstream.rs: the last message picks the answer): create, streamed
events, the stream helper, a function tool streamed and not, another tenant's words
blocked mid-stream (`response.incomplete`, `content_filter`), an upstream dying mid-stream
(`response.failed`).

Usage: python responses_upstream.py BASE_URL KEY OTHER_TENANTS_KEY MODEL
Exits 0 when every check passes; prints one line per check.
"""
import json
import sys

from openai import OpenAI

OTHER_TENANTS_WORDS = "the falcon ridge partners memo says our northern shipping unit sells for four hundred million dollars next spring"


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        sys.exit(1)


def events(stream):
    out = list(stream)
    return [e.type for e in out], out


def main():
    base_url, key, other_key, model = sys.argv[1:5]
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0)
    other = OpenAI(base_url=base_url, api_key=other_key, max_retries=0)
    # The other tenant's prompt is the upstream's request 0 (spliced back below).
    other.responses.create(model=model, input=OTHER_TENANTS_WORDS)

    r = client.responses.create(model=model, input="hello sdk")
    check("create", r.output_text == "Echo: hello sdk" and r.status == "completed" and r.usage.total_tokens > 0, repr(r.output_text))

    kinds, evs = events(client.responses.create(model=model, input="hello sdk", stream=True))
    text = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    check("create(stream=True)", text == "Echo: hello sdk" and kinds[0] == "response.created" and kinds[-1] == "response.completed", repr(kinds))

    with client.responses.stream(model=model, input="hello sdk") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    check("responses.stream", final.output_text == "Echo: hello sdk", repr(final.output_text))

    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    r = client.responses.create(model=model, input="#tools", tools=tools)
    calls = [o for o in r.output if o.type == "function_call"]
    check("function_call item", len(calls) == 1 and isinstance(json.loads(calls[0].arguments), dict), repr(r.output))
    kinds, evs = events(client.responses.create(model=model, input="#tools", tools=tools, stream=True))
    args = "".join(e.delta for e in evs if e.type == "response.function_call_arguments.delta")
    done = [e.item for e in evs if e.type == "response.output_item.done" and e.item.type == "function_call"]
    check("function_call streamed", len(done) == 1 and done[0].arguments == args and kinds[-1] == "response.completed", repr(kinds))

    # (the first words of a foreign run are released before its first n-gram completes)
    kinds, evs = events(client.responses.create(model=model, input="#splice 0 0 20", stream=True))
    text = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    last = evs[-1]
    check("another tenant's words blocked mid-stream",
          kinds[-1] == "response.incomplete" and last.response.incomplete_details.reason == "content_filter" and "four hundred million" not in text,
          repr((kinds[-1], text)))

    kinds, evs = events(client.responses.create(model=model, input="#die", stream=True))
    check("upstream dying mid-stream", kinds[-2:] == ["error", "response.failed"] and evs[-1].response.status == "failed", repr(kinds[-3:]))


if __name__ == "__main__":
    main()
