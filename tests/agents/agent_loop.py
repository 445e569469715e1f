"""The OpenAI Agents SDK, unchanged, running a tool-calling agent against a server: run in
the agents venv (tests/agents/requirements.txt) as `python agent_loop.py URL` (the chat
completions model) or `python agent_loop.py URL --responses` (the Responses API model,
turns chained by previous_response_id; `--resend`: the whole input sent every turn).
Prints one JSON line: the tool's calls, the item kinds of the run, and the final output."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Literal

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
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


async def main(url: str, mode: list[str]) -> None:
    set_tracing_disabled(True)  # no trace export: nothing leaves the machine
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    kind = OpenAIResponsesModel if "--responses" in mode else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather",
        instructions="Answer questions about the weather.",
        tools=[get_weather],
        model=kind(model="mistral-7b-instruct", openai_client=client),
        # The first turn must call the tool; the SDK then resets tool_choice (auto).
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=48, temperature=0),
    )
    chained = "--responses" in mode and "--resend" not in mode
    result = await Runner.run(
        agent, "What is the weather in Paris?", max_turns=4, auto_previous_response_id=chained
    )
    items = [type(item).__name__ for item in result.new_items]
    print(json.dumps({"calls": CALLS, "items": items, "final": result.final_output}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
