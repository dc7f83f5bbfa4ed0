"""Drives a gateway serving the engine with the official `openai` Python SDK, the way
agent frameworks use it: structured outputs through `beta.chat.completions.parse` and
`.stream` on twenty Pydantic models of different shapes, `json_object`, a refused
schema, and a tool-calling conversation's second turn (`content: null` beside
`tool_calls`, then a `tool` message, as LangChain sends it), an agent loop, a streamed
named call, and legacy `completions.create`, streamed and not.

Usage: python agent_api.py BASE_URL API_KEY MODEL
Exits 0 when every check passes; prints one line per check.
"""
import enum
import json
import sys
from typing import List, Literal, Optional

import openai
from openai import OpenAI
from pydantic import BaseModel, Field

Short = Field(max_length=24)


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        sys.exit(1)


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Person(BaseModel):
    name: str = Short
    age: int = Field(ge=0, le=130)


class Answer(BaseModel):
    answer: Literal["yes", "no"]


class Flag(BaseModel):
    ok: bool


class Score(BaseModel):
    value: float = Field(ge=0, le=10)


class Paint(BaseModel):
    color: Color


class Tags(BaseModel):
    tags: List[str] = Field(max_length=3)


class Point(BaseModel):
    x: int = Field(ge=-100, le=100)
    y: int = Field(ge=-100, le=100)


class Line(BaseModel):
    start: Point
    end: Point


class Polygon(BaseModel):
    points: List[Point] = Field(max_length=4)


class Address(BaseModel):
    street: str = Short
    city: str = Short
    zip: Optional[str] = Field(max_length=10)


class Contact(BaseModel):
    person: Person
    address: Address
    emails: List[str] = Field(max_length=2)


class Step(BaseModel):
    action: Literal["read", "write", "delete"]
    target: str = Short


class Plan(BaseModel):
    goal: str = Short
    steps: List[Step] = Field(max_length=3)


class Weather(BaseModel):
    city: str = Short
    unit: Literal["celsius", "fahrenheit"]
    temperature: Optional[int] = Field(ge=-80, le=60)


class Review(BaseModel):
    stars: int = Field(ge=1, le=5)
    summary: str = Short
    recommend: bool


class Matrix(BaseModel):
    rows: List[List[int]] = Field(max_length=2)


class Event(BaseModel):
    title: str = Short
    day: Literal["mon", "tue", "wed", "thu", "fri"]
    attendees: List[Person] = Field(max_length=2)


class Inventory(BaseModel):
    items: List[str] = Field(max_length=3)
    counts: List[int] = Field(max_length=3)
    total: int = Field(ge=0, le=1000)


class Toggle(BaseModel):
    feature: Literal["dark_mode", "beta", "search"]
    enabled: bool
    note: Optional[str] = Field(max_length=16)


class Nested(BaseModel):
    level1: "Level1"


class Level1(BaseModel):
    level2: "Level2"


class Level2(BaseModel):
    label: str = Short
    paint: Paint


Nested.model_rebuild()

SCHEMAS = [
    (Person, "Give me a person."),
    (Answer, "Is water wet?"),
    (Flag, "Is the service up?"),
    (Score, "Rate this film from 0 to 10."),
    (Paint, "Pick a color."),
    (Tags, "Tag this post about cooking."),
    (Point, "Give me a point."),
    (Line, "Give me a line segment."),
    (Polygon, "Give me a triangle."),
    (Address, "Give me an address in Paris."),
    (Contact, "Give me a contact card."),
    (Plan, "Plan to clean up old log files."),
    (Weather, "What is the weather in Oslo?"),
    (Review, "Review a coffee shop."),
    (Matrix, "Give me a 2x2 matrix."),
    (Event, "Schedule a meeting."),
    (Inventory, "List a small inventory."),
    (Toggle, "Turn on dark mode."),
    (Nested, "Describe a nested label."),
    (Weather, "Weather in Lima, in fahrenheit."),
]


def main():
    base_url, api_key, model = sys.argv[1:4]
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

    parsed = 0
    for i, (schema, question) in enumerate(SCHEMAS):
        messages = [{"role": "user", "content": question}]
        r = client.beta.chat.completions.parse(
            model=model, messages=messages, response_format=schema, max_tokens=200, temperature=0.7, seed=i
        )
        msg = r.choices[0].message
        ok = isinstance(msg.parsed, schema)
        parsed += ok
        if not ok:
            print(f"     {schema.__name__}: {msg.content!r}")
    check("parse: 20 schemas", parsed == len(SCHEMAS), f"{parsed}/{len(SCHEMAS)}")

    streamed = 0
    for i, (schema, question) in enumerate(SCHEMAS):
        messages = [{"role": "user", "content": question}]
        with client.beta.chat.completions.stream(
            model=model, messages=messages, response_format=schema, max_tokens=200, temperature=0.7, seed=100 + i
        ) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        ok = isinstance(final.choices[0].message.parsed, schema)
        streamed += ok
        if not ok:
            print(f"     {schema.__name__}: {final.choices[0].message.content!r}")
    check("stream: 20 schemas", streamed == len(SCHEMAS), f"{streamed}/{len(SCHEMAS)}")

    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
        response_format={"type": "json_object"},
        max_tokens=120,
    )
    content = r.choices[0].message.content
    try:
        ok = isinstance(json.loads(content), dict)
    except ValueError:
        ok = False
    check("json_object", ok or r.choices[0].finish_reason == "length", repr(content))

    try:
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "x"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "u", "schema": {"type": "array", "uniqueItems": True}},
            },
        )
        check("unenforceable schema -> 400", False, "no exception")
    except openai.BadRequestError as e:
        check(
            "unenforceable schema -> 400",
            e.body.get("param") == "response_format.json_schema.schema" and "uniqueItems" in e.body.get("message", ""),
            repr(e.body),
        )

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                                                               "required": ["city"], "additionalProperties": False}}}]
    second_turn = [
        {"role": "developer", "content": "Answer in one sentence."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = client.chat.completions.create(model=model, messages=second_turn, tools=tools, tool_choice="none", max_tokens=40)
    check("tool conversation, second turn", bool(r.choices[0].message.content), repr(r.choices[0].message.content))

    agent_loop(client, model, tools)
    streamed_call(client, model, tools)
    legacy_completions(client, model)


def legacy_completions(client, model):
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=12, temperature=0, logprobs=2)
    c = r.choices[0]
    ok = r.object == "text_completion" and c.text and r.usage.completion_tokens == len(c.logprobs.tokens)
    ok = ok and "".join(c.logprobs.tokens) == c.text and all(len(t) <= 2 for t in c.logprobs.top_logprobs)
    check("completions.create", bool(ok), repr((c.text, c.finish_reason, r.usage)))
    pieces, finish = [], None
    for chunk in client.completions.create(model=model, prompt="The capital of France is", max_tokens=12, temperature=0, stream=True):
        for ch in chunk.choices:
            pieces.append(ch.text)
            finish = ch.finish_reason or finish
    check("completions.create(stream=True)", "".join(pieces) == c.text and finish == c.finish_reason, repr((pieces, finish)))


def get_weather(city):
    return f"sunny, 21 C in {city}"


def agent_loop(client, model, tools):
    """The loop agent frameworks run: call, run the tool, send the result back, until
    the model answers in text; at the iteration limit the last turn forbids tools
    (`tool_choice: "none"`), as frameworks force a final answer. A 135M model often
    repeats its call under `auto`: the check line says which way the loop ended."""
    messages = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    calls_made = 0
    for turn in range(4):
        choice = "required" if turn == 0 else ("none" if turn == 3 else "auto")
        r = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice=choice,
                                           parallel_tool_calls=False, max_tokens=150, temperature=0)
        msg = r.choices[0].message
        if not msg.tool_calls:
            check("agent loop answers after its tool call", calls_made > 0 and bool(msg.content),
                  f"{calls_made} call(s), answered at turn {turn} (tool_choice {choice}): {msg.content!r}")
            return
        check(f"turn {turn}: finish_reason tool_calls", r.choices[0].finish_reason == "tool_calls", r.choices[0].finish_reason)
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            args = json.loads(call.function.arguments)
            calls_made += 1
            messages.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(args.get("city", "?"))})
    check("agent loop answers after its tool call", False, f"tool_choice none still called: {json.dumps(messages)}")


def streamed_call(client, model, tools):
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True, max_tokens=60,
        temperature=0)
    calls, finish, content = {}, None, ""
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                entry["id"] = entry["id"] or d.id
                entry["name"] = entry["name"] or (d.function.name if d.function else None)
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
    ok = len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["id"] and finish == "tool_calls" and not content
    try:
        args = json.loads(calls[0]["arguments"]) if calls else None
    except ValueError:
        args = None
    check("streamed named tool call", ok and isinstance(args, dict) and isinstance(args.get("city"), str), repr((calls, finish, content)))


if __name__ == "__main__":
    main()
