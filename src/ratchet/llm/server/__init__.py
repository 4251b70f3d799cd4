"""A local model provider that speaks OpenAI's and Anthropic's wire formats, for tests,
demos and benchmarks: ``ratchet llm-server``, or in-process::

    from ratchet.llm.server import LocalProvider, serve

    provider = LocalProvider({"rules": [{"match": {"contains": "hi"},
                                         "reply": {"text": "hello"}}]})
    with serve(provider) as base:          # http://127.0.0.1:PORT
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="local")
        client.chat.completions.create(model="gpt-4.1-mini",
                                       messages=[{"role": "user", "content": "hi"}])
    provider.stats()["billed_calls"]       # 1

Replies are deterministic (the echo of the last user message, or the script's rules);
usage is counted from the text; ``Idempotency-Key`` is honoured as a careful provider
would; faults (429, 500, slow, dropped connections) can be queued.
"""

from ratchet.llm.server.provider import LocalProvider
from ratchet.llm.server.script import ScriptError
from ratchet.llm.server.serving import run_until_signalled, serve

__all__ = ["LocalProvider", "ScriptError", "run_until_signalled", "serve"]
