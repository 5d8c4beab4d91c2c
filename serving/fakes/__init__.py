"""Doubles of the servers the toolkit talks to, for the tests, the bench and the soak (never a model, never a
number in a figure): each answers as its real counterpart's HTTP API does and injects the faults the real thing
cannot be made to produce on demand.

    sglang_server.py   SGLang's native and OpenAI routes over a scripted or tiny-model reply (FakeSGLang, FakeServer)
    vllm_server.py     vLLM's request and response models over the tiny model's logprobs (transformers)
    web_apis.py        Serper search and Lens, Jina Reader, Serper scrape on the loopback (FakeWeb)
    policy.py          the scripted agent their replies follow (agent_policy)
    http_base.py       the JSON handler they share
    standin.py         SGLang's own front end over a scheduler of ours (``python -m serving.fakes.standin``; the
                       launcher's ``--standin``), its engines in standin_engines.py (the tiny model, or planted replies)

The real things run in the tests wherever they run here: SGLang's own front end (standin.py: only its scheduler is
ours), vLLM's CPU engine (tests/test_real_engine.py). The agent's own offline doubles are the embedded default a user
runs, not server doubles: the scripted backend (agent/backends/scripted.py, demo_model.py) and the offline tool world
(agent/tools/offline.py), each marked as planted wherever its numbers appear.
"""
