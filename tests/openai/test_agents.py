"""A real agent framework, unmodified, against `tern serve`: the OpenAI
Agents SDK (`openai-agents`) runs an Agent with a `function_tool` through
the Responses API; the agent calls the tool and finishes with an answer."""

from __future__ import annotations

import openai
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled


def test_an_agent_calls_its_tool_and_finishes(server_url, model_id):
    set_tracing_disabled(True)  # no trace upload: this machine has no account
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        calls.append(city)
        return f"22 C and sunny in {city}"

    client = openai.AsyncOpenAI(api_key="test-key", base_url=f"{server_url}/v1")
    agent = Agent(
        name="weather",
        instructions="Use the tool, then answer.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model_id, openai_client=client),
        # The first turn must call the tool (the SDK resets the choice to
        # `auto` after a call, so the second turn answers); one call per turn.
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=300, temperature=0),
    )
    result = Runner.run_sync(agent, "What is the weather in Rome?", max_turns=4)
    assert len(calls) == 1 and calls[0].strip()
    assert isinstance(result.final_output, str) and result.final_output.strip()
