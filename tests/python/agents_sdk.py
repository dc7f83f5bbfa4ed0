"""The OpenAI Agents SDK (`openai-agents`) against a gateway serving the engine, through
`/v1/responses`: an agent with one function tool runs its loop (the model calls the tool,
the SDK runs it and sends the result back, the model answers), with `Runner.run` and
`Runner.run_streamed`.

The first turn requires a tool call (`tool_choice="required"`; the SDK resets it to auto
after the call, as it does to stop loops): a 135M model under `auto` mostly answers
without calling.

Usage: python agents_sdk.py BASE_URL API_KEY MODEL
Exits 0 when every check passes; prints one line per check.
"""
import asyncio
import sys

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

set_tracing_disabled(True)
calls = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        sys.exit(1)


@function_tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    calls.append(city)
    return f"sunny, 21 C in {city}"


def loop_shape(items):
    kinds = [type(i) for i in items]
    return ToolCallItem in kinds and ToolCallOutputItem in kinds and kinds[-1] is MessageOutputItem


async def main():
    base_url, api_key, model_id = sys.argv[1:4]
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Use the get_weather tool, then answer in one sentence.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model_id, openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=120, tool_choice="required"),
        reset_tool_choice=True,
    )
    for city in ["Paris", "Oslo"]:
        before = len(calls)
        result = await Runner.run(agent, f"What is the weather in {city}?", max_turns=4)
        ok = loop_shape(result.new_items) and len(calls) > before and bool(result.final_output)
        check(f"Runner.run: {city}", ok, repr(([type(i).__name__ for i in result.new_items], calls[before:], result.final_output)))

    before = len(calls)
    result = Runner.run_streamed(agent, "What is the weather in Rome?", max_turns=4)
    events = [e async for e in result.stream_events()]
    ok = loop_shape(result.new_items) and len(calls) > before and bool(result.final_output)
    check("Runner.run_streamed", ok, repr((len(events), calls[before:], result.final_output)))


asyncio.run(main())
