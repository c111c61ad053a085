"""Requests the demo model (models/gemma4-tiny-qat, trained on agent work by tools/python/train_tiny_agent.py)
answers by itself, greedy, without the scripted adapter: shared by the tests that require its own agent work
(test_agent_api, test_responses_api, test_langchain, test_anthropic_messages). Winchester and Caroline Ward are
held-out names of tools/python/agent_tools.py: no training example has them."""

CITY = "Winchester"
WEATHER_ASK = f"What's the weather in {CITY}?"
WEATHER_DESCRIPTION = "Get the current weather in a city"
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": WEATHER_DESCRIPTION,
                                                 "parameters": WEATHER_PARAMETERS}}
WEATHER_RESULT = {"forecast": "sunny", "temperature": 18}  # a get_weather result whose values the answer states
PERSON_ASK = "Caroline Ward is 27 years old."
PERSON = {"name": "Caroline Ward", "age": 27}
