"""The token-logging shim: Anthropic Messages and OpenAI Chat Completions in front of an engine.

`python -m clawjax.serving --help` runs it; `clawjax.serving.server.ShimServer` (asyncio) and
`ShimThread` (a thread of its own) run it in-process. Backends live in `clawjax.serving.backends`.
"""
