"""The OpenAI Agents SDK, unchanged, running a tool-calling agent against a server: run in
the agents venv (tests/agents/requirements.txt) as `python agent_loop.py URL`. Prints one
JSON line: the tool's calls, the item kinds of the run, and the final output."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Literal

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

CALLS: list[str] = []


@function_tool
def get_weather(city: Literal["Paris", "Lyon"]) -> str:
    """Weather in a city."""
    CALLS.append(city)
    return f"20 C and sunny in {city}"


async def main(url: str) -> None:
    set_tracing_disabled(True)  # no trace export: nothing leaves the machine
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer questions about the weather.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model="mistral-7b-instruct", openai_client=client),
        # The first turn must call the tool; the SDK then resets tool_choice (auto).
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=48, temperature=0),
    )
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    items = [type(item).__name__ for item in result.new_items]
    print(json.dumps({"calls": CALLS, "items": items, "final": result.final_output}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
