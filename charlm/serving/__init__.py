"""`charlm serve`: the HTTP server (OpenAI's completions API, scoring, attention, the playground page), the engine
that decodes every running completion together, and the checks on each request body.

May import charlm.api and everything below it; only the CLI imports it.
"""
