"""Test doubles that ship with the runtime (STYLE.md item 13).

`workers.testing.fake_openai` is a scripted OpenAI-compatible chat-completions server used as the
fake LLM at the model boundary. Nothing is re-exported here on purpose: importing the server module
from this package would make `python -m workers.testing.fake_openai` warn that the module was
already imported before being run as `__main__`.
"""
