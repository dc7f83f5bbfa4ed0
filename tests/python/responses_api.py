"""Drives a gateway serving the engine through the official `openai` Python SDK's
Responses API, the way the OpenAI Agents SDK uses it: `responses.create` (plain and
streamed), `responses.stream` with its event accumulator, `responses.parse` with Pydantic
models, a function-tool loop both stateless (items sent back) and stateful
(`previous_response_id`), `retrieve` / `delete`, and refusals by parameter.

Usage: python responses_api.py BASE_URL API_KEY MODEL
Exits 0 when every check passes; prints one line per check.
"""
import json
import sys
from typing import List, Literal, Optional

import openai
from openai import OpenAI
from pydantic import BaseModel, Field


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        sys.exit(1)


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=130)


class Answer(BaseModel):
    answer: Literal["yes", "no"]


class Point(BaseModel):
    x: int = Field(ge=-100, le=100)
    y: int = Field(ge=-100, le=100)


class Polygon(BaseModel):
    points: List[Point] = Field(max_length=4)


class Weather(BaseModel):
    city: str = Field(max_length=24)
    unit: Literal["celsius", "fahrenheit"]
    temperature: Optional[int] = Field(ge=-80, le=60)


SCHEMAS = [
    (Person, "Give me a person."),
    (Answer, "Is water wet?"),
    (Polygon, "Give me a triangle."),
    (Weather, "What is the weather in Oslo?"),
]

TOOLS = [{
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True,
}]


def main():
    base_url, api_key, model = sys.argv[1:4]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

    r = client.responses.create(model=model, input="What is the capital of France?", instructions="Answer in one sentence.",
                                max_output_tokens=30, temperature=0)
    check("responses.create", r.status in ("completed", "incomplete") and bool(r.output_text) and r.usage.output_tokens > 0,
          repr((r.status, r.output_text, r.usage)))
    fetched = client.responses.retrieve(r.id)
    check("responses.retrieve", fetched.id == r.id and fetched.output_text == r.output_text, repr(fetched.output_text))

    deltas, kinds = [], []
    for event in client.responses.create(model=model, input="What is the capital of France?", instructions="Answer in one sentence.",
                                         max_output_tokens=30, temperature=0, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    ok = kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    check("responses.create(stream=True)", ok and "".join(deltas) == final.output_text == r.output_text, repr(("".join(deltas), kinds[-1])))

    # (get_final_response needs `response.completed`: an answer the limit cuts is `incomplete`)
    with client.responses.stream(model=model, input="What is the capital of France?", instructions="Answer in one sentence.",
                                 max_output_tokens=30, temperature=0) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    check("responses.stream accumulates", text == final.output_text and bool(text), repr(text))

    parsed = 0
    for i, (schema, question) in enumerate(SCHEMAS):
        r = client.responses.parse(model=model, input=question, text_format=schema, max_output_tokens=200, temperature=0.7)
        ok = isinstance(r.output_parsed, schema)
        parsed += ok
        if not ok:
            print(f"     {schema.__name__}: {r.output_text!r}")
    check(f"responses.parse: {len(SCHEMAS)} schemas", parsed == len(SCHEMAS), f"{parsed}/{len(SCHEMAS)}")

    agent_loop_stateless(client, model)
    agent_loop_stored(client, model)
    refusals(client, model)


def get_weather(city):
    return f"sunny, 21 C in {city}"


def agent_loop_stateless(client, model):
    """The Agents SDK's default loop: every turn sends the whole item list back."""
    items = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    r = client.responses.create(model=model, input=items, tools=TOOLS, tool_choice="required", max_output_tokens=150, temperature=0, store=False)
    calls = [o for o in r.output if o.type == "function_call"]
    check("function_call item", len(calls) >= 1 and calls[0].name == "get_weather" and calls[0].call_id, repr(r.output))
    args = json.loads(calls[0].arguments)
    items += [o.model_dump(exclude_none=True) for o in r.output]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": get_weather(args.get("city", "?"))} for c in calls]
    r = client.responses.create(model=model, input=items, tools=TOOLS, tool_choice="none", max_output_tokens=60, temperature=0, store=False)
    check("stateless loop answers after the tool result", bool(r.output_text) and not any(o.type == "function_call" for o in r.output),
          repr(r.output_text))


def agent_loop_stored(client, model):
    """The stateful loop: only the tool result goes back, with previous_response_id."""
    r = client.responses.create(model=model, input="What is the weather in Rome? Use the tool.", tools=TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=150, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    check("named function call", len(calls) == 1 and calls[0].name == "get_weather", repr(r.output))
    follow = client.responses.create(model=model, previous_response_id=r.id, tools=TOOLS, tool_choice="none", max_output_tokens=60,
                                     temperature=0, input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                                            "output": get_weather("Rome")}])
    check("previous_response_id loop answers", bool(follow.output_text) and follow.previous_response_id == r.id, repr(follow.output_text))
    client.responses.delete(r.id)
    try:
        client.responses.retrieve(r.id)
        check("deleted response is gone", False, "retrieved after delete")
    except openai.NotFoundError:
        check("deleted response is gone", True)


def refusals(client, model):
    cases = [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"previous_response_id": "resp_does_not_exist"}, "previous_response_id"),
        ({"text": {"format": {"type": "json_schema", "name": "u", "schema": {"type": "array", "uniqueItems": True}}}}, "text.format.schema"),
    ]
    for extra, param in cases:
        try:
            client.responses.create(model=model, input="x", max_output_tokens=5, **extra)
            check(f"refused: {param}", False, "no exception")
        except openai.BadRequestError as e:
            check(f"refused: {param}", e.body.get("param") == param, repr(e.body))


if __name__ == "__main__":
    main()
