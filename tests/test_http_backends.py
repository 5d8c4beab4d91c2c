"""OpenAI-compatible and SGLang-native backends against a loopback server speaking SGLang's format."""
import asyncio
import json

import httpx
import numpy as np
import pytest

from agent.backends import BackendError, Continuation, SamplingParams
from agent.backends.openai_compat import OpenAIBackend
from agent.backends.sglang_native import SGLangBackend
from agent.backends.wire import tokens_from_triples
from agent.http import RetryPolicy
from agent.model_http import ModelClient
from tests.guards import HANG_GUARD_S

FAST = RetryPolicy(retries=2, backoff_s=0.01, timeout_s=10)


def msgs(img):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": str(img)}},
                                         {"type": "text", "text": "What is this?"}]}]


@pytest.fixture
async def native(fake_sglang, tiny_model_dir):
    b = SGLangBackend(fake_sglang.url, str(tiny_model_dir), policy=FAST)
    yield b
    await b.aclose()


async def test_native_generate_parses_triples_and_think(native, fake_sglang, red_image):
    out = await native.generate(msgs(red_image), SamplingParams(max_tokens=64))
    body = fake_sglang.bodies[-1]
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 20
    assert body["sampling_params"]["temperature"] == 0.2 and body["sampling_params"]["top_p"] == 0.95
    assert body["image_data"][0].startswith("data:image/png;base64,")
    # token ids, never text: the rendered prompt tokenised as the tokenizer tokenises it whole, and handed back by
    # message piece (what the run records, agent/backends/pieces.py)
    prompt = out.request["prompt_text"]
    assert "text" not in body and prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert body["input_ids"] == native.tok(prompt, add_special_tokens=False)["input_ids"]
    fingerprint, pieces = out.prompt_pieces
    assert fingerprint == native.fingerprint and len(fingerprint) == 64
    assert [i for _, ids in pieces for i in ids.tolist()] == body["input_ids"]
    assert "input_ids" not in out.request
    assert out.reasoning == "Let me look at the picture."
    assert out.text == "\n\nIt shows a red square."  # as SGLang's parser leaves it (agent/backends/think.py)
    assert all(len(t.top) == 20 and t.id is not None for t in out.tokens)
    close = [i for i, t in enumerate(out.tokens) if t.text == "</think>"][0]
    assert all(t.think for t in out.tokens[:close]) and not any(t.think for t in out.tokens[close:])
    assert out.semantics.label() == "scaled(T=0.2)" and out.finish_reason == "stop"
    assert "base64" not in json.dumps(out.request)


async def test_native_score_takes_last_n_entries_and_verifies_ids(native, fake_sglang, red_image, tiny_model_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("It is red.", add_special_tokens=False)["input_ids"]
    sc = await native.score(msgs(red_image), Continuation(ids=ids))
    assert [t.id for t in sc.tokens] == ids and sc.semantics.kind == "raw"
    assert all(len(t.top) == 20 for t in sc.tokens)
    body = fake_sglang.bodies[-1]
    assert body["sampling_params"]["max_new_tokens"] == 0 and body["logprob_start_len"] >= 0


async def test_a_score_whose_images_did_not_arrive_whole_is_refused(native, fake_sglang, red_image, tiny_model_dir):
    """SGLang #39831: a server that reduces each image to one token (while it still reports image support) scores
    text that never saw the images; its own prompt count gives it away against the processor's expansion."""
    from agent.backends.local import load_chat_renderer

    ids = load_chat_renderer(str(tiny_model_dir))("It is red.", add_special_tokens=False)["input_ids"]
    for short in ("all", 1):  # every image one token (the server refuses the start), or one token short
        fake_sglang.image_shortfall = short
        with pytest.raises(BackendError, match="the images did not arrive as the model sees them"):
            await native.score(msgs(red_image), Continuation(ids=ids))
    fake_sglang.image_shortfall = None
    assert [t.id for t in (await native.score(msgs(red_image), Continuation(ids=ids))).tokens] == ids


async def test_native_score_over_a_kept_alive_connection(tiny_model_dir, red_image):
    """The benches' fake speaks HTTP/1.1 with persistent connections, as SGLang's server does: consecutive
    scorings reuse one connection (the default fake closes it after every reply) and score the same."""
    from agent.backends.local import load_chat_renderer
    from serving.fakes.sglang_server import FakeSGLang

    ids = load_chat_renderer(str(tiny_model_dir))("It is red.", add_special_tokens=False)["input_ids"]
    got = {}
    for keep in (False, True):
        with FakeSGLang(tokenizer_dir=str(tiny_model_dir), keep_alive=keep) as srv:
            b = SGLangBackend(srv.url, str(tiny_model_dir), policy=FAST)
            scores = [await b.score(msgs(red_image), Continuation(ids=ids)) for _ in range(3)]
            got[keep] = (srv.connections, [[t.logprob for t in s.tokens] for s in scores])
    assert got[False][0] == 3 and got[True][0] == 1
    assert got[True][1] == got[False][1] and got[True][1][0] == got[True][1][2]


async def test_native_score_malformed_triple_is_an_error_naming_it(native, fake_sglang, red_image, tiny_model_dir):
    """A scored position whose triple is not [logprob, id, text] takes the element-wise check (no crash in the
    fast comparison) and is refused as drifted ids, naming the position."""
    from agent.backends.local import load_chat_renderer

    ids = load_chat_renderer(str(tiny_model_dir))("It is red.", add_special_tokens=False)["input_ids"]
    b = native
    resp = {"meta_info": {"input_token_logprobs": [[-0.1, i, None] for i in ids[:-1]] + [{"bad": 1}],
                          "input_top_logprobs": [None] * len(ids)}}
    with pytest.raises(BackendError, match=f"continuation token {len(ids) - 1}: server None"):
        b.parse_score(resp, ids, k=20)
    resp["meta_info"]["input_token_logprobs"][-1] = [-0.1, float(ids[-1]) + 0.5, None]
    with pytest.raises(BackendError, match="drifted"):
        b.parse_score(resp, ids, k=20)


async def test_native_score_flat_top_logprobs_are_the_nested_ones(tiny_model_dir, red_image, capsys):
    """Scoring asks for SGLang's flat base64 top-logprob arrays; they give exactly the arrays the nested triples
    give, with and without an image. A server that ignores the fields answers nested (parsed as before); one that
    refuses them with a 400 is asked again without them, once, said on stderr, and nested from then on."""
    from agent.backends.local import load_chat_renderer
    from serving.fakes.sglang_server import FakeSGLang

    ids = load_chat_renderer(str(tiny_model_dir))("It is red, I think.", add_special_tokens=False)["input_ids"]
    text_only = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}]}]
    got = {}
    for mode in ("yes", "ignore", "refuse"):
        with FakeSGLang(tokenizer_dir=str(tiny_model_dir), flat=mode) as srv:
            b = SGLangBackend(srv.url, str(tiny_model_dir), policy=FAST)
            got[mode] = [await b.score(m, Continuation(ids=ids)) for m in (msgs(red_image), text_only, text_only)]
            sent = [bool(x.get("return_flat_raw_top_logprobs")) for x in srv.bodies]
            assert srv.bodies[0]["return_flat_raw_top_logprobs_b64"] is True
        if mode == "refuse":
            assert sent == [True, False, False, False] and not b.flat_logprobs  # refused once, then nested
            assert "refused SGLang's flat top-logprob format" in capsys.readouterr().err
        else:
            assert sent == [True, True, True]
        wire = [s.request["top_logprobs_wire"] for s in got[mode]]
        assert wire == (["flat"] * 3 if mode == "yes" else ["nested"] * 3)
    for a, b_, c in zip(got["yes"], got["ignore"], got["refuse"]):
        for x in (b_, c):
            for f in ("ids", "logprobs", "top_ids", "top_logprobs", "counts", "think"):
                assert np.array_equal(getattr(a.tokens, f), getattr(x.tokens, f)), f
            assert a.tokens.texts == x.tokens.texts
        assert a.tokens.top_logprobs.shape == (len(ids), 20) and a.tokens.top_logprobs.dtype == np.float64
        assert not any("flat" in key for key in a.response["meta_info"])  # the arrays are not kept with the reply


@pytest.mark.parametrize("fault", ["short", "dtype", "shape", "cover", "half", "alphabet"])
def test_native_score_malformed_flat_top_logprobs_are_refused_naming_the_field(native, fault):
    import base64

    n, k = 4, 3
    p = np.random.default_rng(0).random((n, k))  # one distribution a row: the top k hold 90 % of the mass
    val = np.sort(np.log(0.9 * p / p.sum(axis=1, keepdims=True)).astype(np.float32), axis=1)[:, ::-1].copy()
    idx = np.arange(n * k, dtype=np.int32).reshape(n, k)
    meta = {"input_token_logprobs": [[None, 7, None]] + [[-0.5, 7 + i, None] for i in range(n)],
            "input_top_logprobs_val_flat_b64": base64.b64encode(val.tobytes()).decode(),
            "input_top_logprobs_idx_flat_b64": base64.b64encode(idx.tobytes()).decode(),
            "input_top_logprobs_val_flat_b64_dtype": "float32", "input_top_logprobs_idx_flat_b64_dtype": "int32",
            "input_top_logprobs_shape": [n, k], "input_top_logprobs_null_prefix": 1}
    ids = [7 + i for i in range(n)]
    ok = native.parse_score({"meta_info": dict(meta)}, ids, k=k)
    assert np.array_equal(ok.top_logprobs, val.astype(np.float64)) and np.array_equal(ok.top_ids, idx)
    plain = {key: v for key, v in meta.items() if "b64" not in key}  # the flat lists without base64: the same
    plain.update({"input_top_logprobs_val_flat": val.ravel().tolist(), "input_top_logprobs_idx_flat": idx.ravel().tolist()})
    same = native.parse_score({"meta_info": plain}, ids, k=k)
    assert np.array_equal(same.top_logprobs, ok.top_logprobs) and np.array_equal(same.top_ids, ok.top_ids)
    bad = {"short": ("input_top_logprobs_val_flat_b64", base64.b64encode(val.tobytes()[:-4]).decode(), "bytes"),
           "dtype": ("input_top_logprobs_idx_flat_b64_dtype", "bfloat16", "dtype"),
           "shape": ("input_top_logprobs_shape", [n, k, 1], "shape"),
           "cover": ("input_top_logprobs_null_prefix", 0, "cover"),
           "half": ("input_top_logprobs_idx_flat_b64", None, "input_top_logprobs_idx_flat_b64"),
           # a character outside base64's alphabet (the lenient decoder would drop it and read shifted bytes)
           "alphabet": ("input_top_logprobs_val_flat_b64", "!" + base64.b64encode(val.tobytes()).decode()[1:],
                        "not base64")}[fault]
    meta[bad[0]] = bad[1]
    with pytest.raises(BackendError, match=bad[2]):
        native.parse_score({"meta_info": meta}, ids, k=k)


async def test_native_score_drift_is_an_error(native, fake_sglang, red_image, tiny_model_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("It is red.", add_special_tokens=False)["input_ids"]
    fake_sglang.faults = ["drift"]
    with pytest.raises(BackendError, match="drifted"):
        await native.score(msgs(red_image), Continuation(ids=ids))


async def test_429_then_success(native, fake_sglang, red_image):
    fake_sglang.faults = ["429", None]
    out = await native.generate(msgs(red_image), SamplingParams(max_tokens=8))
    assert out.tokens and fake_sglang.requests.count("/generate") == 2


async def test_500_until_retries_run_out(native, fake_sglang, red_image):
    fake_sglang.faults = ["500"] * 5
    with pytest.raises(BackendError, match=r"failed after 3 attempts.*HTTP 500"):
        await native.generate(msgs(red_image), SamplingParams(max_tokens=8))


async def test_truncated_bodies_are_retried_and_client_errors_are_clear(native, fake_sglang, red_image):
    fake_sglang.faults = ["malformed"]  # a 200 cut short in transit: retried like a 5xx
    out = await native.generate(msgs(red_image), SamplingParams(max_tokens=8))
    assert out.tokens and fake_sglang.requests.count("/generate") == 2
    fake_sglang.faults = ["malformed"] * 3  # still cut after every retry (FAST allows 2): a clear error
    with pytest.raises(BackendError, match="malformed or truncated JSON"):
        await native.generate(msgs(red_image), SamplingParams(max_tokens=8))
    n = fake_sglang.requests.count("/generate")
    fake_sglang.faults = ["400"]
    with pytest.raises(BackendError, match="HTTP 400"):
        await native.generate(msgs(red_image), SamplingParams(max_tokens=8))
    assert fake_sglang.requests.count("/generate") == n + 1  # a 400 is not retried


async def test_unreachable_endpoint_names_it(red_image, tiny_model_dir):
    b = SGLangBackend("http://127.0.0.1:9", str(tiny_model_dir), policy=RetryPolicy(retries=1, backoff_s=0.01, timeout_s=2))
    with pytest.raises(BackendError, match="127.0.0.1:9"):
        await b.generate(msgs(red_image), SamplingParams(max_tokens=4))


async def test_chat_with_meta_info_has_ids_and_think(fake_sglang, red_image):
    b = OpenAIBackend(fake_sglang.url, policy=FAST)
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=64))
    body = fake_sglang.bodies[-1]
    assert body["model"] == "fake-qwen3.5"  # resolved from /v1/models
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["return_meta_info"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert out.reasoning == "Let me look at the picture." and out.text == "\n\nIt shows a red square."
    assert all(t.id is not None and len(t.top) == 20 for t in out.tokens)
    assert any(t.think for t in out.tokens) and not out.tokens[-1].think


async def test_chat_without_meta_info_dedupes_and_counts(fake_sglang, red_image):
    b = OpenAIBackend(fake_sglang.url, model="fake-qwen3.5", server="generic", policy=FAST)
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=64))
    assert "return_meta_info" not in fake_sglang.bodies[-1]
    counts = out.top_counts()
    assert all(1 <= c <= 20 for c in counts) and min(counts) < 20  # deduped by text
    assert all(t.id is None for t in out.tokens)
    assert any(t.think for t in out.tokens)
    with pytest.raises(BackendError, match="scoring"):
        await b.score(msgs(red_image), Continuation(text="x"))


def test_real_sglang_stream_event_parses(shared_dir):
    body = json.loads((shared_dir / "data/sglang_responses/generate_logprobs_stream_event1_sglang_pr17005.json").read_text())
    toks = tokens_from_triples(body["meta_info"]["output_token_logprobs"], body["meta_info"]["output_top_logprobs"])
    assert [t.id for t in toks] == body["output_ids"] == [16]
    assert [a.id for a in toks[0].top] == [16, 6648, 17, 11319]
    assert toks[0].logprob == toks[0].top[0].logprob
    # input side: the first entry is [null, id, null] with a null top list (no logprob for the first prompt
    # token); the toolkit reads only the entries after it, and a null logprob anywhere else is refused
    entries, tops = body["meta_info"]["input_token_logprobs"], body["meta_info"]["input_top_logprobs"]
    assert entries[0][0] is None and entries[0][1] == 220 and tops[0] is None
    from agent.backends.base import BadReply

    with pytest.raises(BadReply, match=r"logprob .*nan.* at position \(0,\)"):
        tokens_from_triples(entries, tops)
    if len(entries) > 1:
        rest = tokens_from_triples(entries[1:], tops[1:])
        assert [t.id for t in rest] == [e[1] for e in entries[1:]]


def test_real_chat_body_without_logprobs_is_a_clear_error(shared_dir):
    body = json.loads((shared_dir / "data/sglang_responses/chat_completion_reasoning_qwen3.json").read_text())
    b = OpenAIBackend("http://127.0.0.1:1", model="m")
    with pytest.raises(BackendError, match="no logprobs"):
        b.parse(body, SamplingParams())


# ------------------------------------------------------------------ fixes a real SGLang node would need
async def test_native_text_only_scoring_sends_token_ids(native, fake_sglang, tiny_model_dir):
    """A continuation starting with the "\\n" that follows the <think>\\n pre-fill would merge with it when the
    server re-tokenises text; sent as ids, it scores exactly."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text_only = [{"role": "user", "content": "What is this?"}]
    prompt = native.render(text_only, {"enable_thinking": True})[0]
    cont = tok("\nI see red.", add_special_tokens=False)["input_ids"]
    # re-tokenising prompt + continuation as text merges "\n" into the prompt's last token: the old text path
    # would have raised the id-drift error on this continuation
    assert tok(prompt + tok.decode(cont), add_special_tokens=False)["input_ids"][-len(cont):] != cont
    sc = await native.score(text_only, Continuation(ids=cont))
    body = fake_sglang.bodies[-1]
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert "text" not in body and body["input_ids"] == prompt_ids + cont
    assert body["logprob_start_len"] == len(prompt_ids) - 1
    assert [t.id for t in sc.tokens] == cont and sc.request["by"] == "ids"


async def test_native_image_scoring_starts_after_the_expanded_images(native, fake_sglang, red_image, tiny_model_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("It is red.", add_special_tokens=False)["input_ids"]
    await native.score(msgs(red_image), Continuation(ids=ids))
    body = fake_sglang.bodies[-1]
    assert "image_data" in body
    # only the continuation (and the prompt's last token) came back: no logprobs for the image tokens
    import httpx as _h

    r = _h.post(fake_sglang.url + "/generate", json=body, timeout=30).json()
    assert len(r["meta_info"]["input_token_logprobs"]) == len(ids) + 1
    # the unexpanded length would have asked for every image token's top-20
    prompt = native.render(msgs(red_image), {"enable_thinking": True})[0]
    n_unexpanded = len(AutoTokenizer.from_pretrained(tiny_model_dir)(prompt, add_special_tokens=False)["input_ids"])
    assert body["logprob_start_len"] > n_unexpanded - 1


async def test_native_generation_ending_thinking_at_a_tool_call(fake_sglang, tiny_model_dir, red_image):
    """Qwen3.5 sometimes opens <tool_call> without closing </think>: the action must not be lost in the reasoning."""
    from agent.parsing import parse_action

    fake_sglang.reply = 'I will search.\n<tool_call>\n{"name": "search", "arguments": {"query": "red"}}\n</tool_call>'
    b = SGLangBackend(fake_sglang.url, str(tiny_model_dir), policy=FAST)
    out = await b.generate(msgs(red_image), SamplingParams(max_tokens=200))
    assert out.reasoning == "I will search.\n" and out.text.startswith("<tool_call>")
    assert parse_action(out.text).name == "search"
    first_call = next(i for i, t in enumerate(out.tokens) if "<tool_call>" in t.text)
    assert all(t.think for t in out.tokens[:first_call]) and not any(t.think for t in out.tokens[first_call:])
    await b.aclose()


async def test_both_paths_send_the_full_sampling_set(native, fake_sglang, red_image):
    await native.generate(msgs(red_image), SamplingParams(max_tokens=8, seed=7))
    sp = fake_sglang.bodies[-1]["sampling_params"]
    assert (sp["top_k"], sp["min_p"], sp["repetition_penalty"], sp["sampling_seed"]) == (-1, 0.0, 1.0, 7)
    chat = OpenAIBackend(fake_sglang.url, model="fake-qwen3.5", server="sglang", policy=FAST)
    await chat.generate(msgs(red_image), SamplingParams(max_tokens=8, seed=7))
    body = fake_sglang.bodies[-1]
    assert (body["top_k"], body["min_p"], body["repetition_penalty"], body["seed"]) == (-1, 0.0, 1.0, 7)
    await chat.aclose()


def test_a_hub_id_model_dir_resolves_from_the_local_cache_only(tmp_path, tiny_model_dir, monkeypatch):
    import shutil

    cache = tmp_path / "hub"
    snap = cache / "models--Qwen--Qwen3.5-27B" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model_dir, snap)
    (cache / "models--Qwen--Qwen3.5-27B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen3.5-27B" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import importlib

    import huggingface_hub.constants as c

    importlib.reload(c)
    try:
        b = SGLangBackend("http://127.0.0.1:1", "Qwen/Qwen3.5-27B")
        assert b.model_dir_name == "Qwen3.5-27B" and str(b.model_dir) == str(snap)
        with pytest.raises(BackendError, match="not in the local Hugging Face cache.*huggingface-cli download Qwen/Qwen3.5-9B"):
            SGLangBackend("http://127.0.0.1:1", "Qwen/Qwen3.5-9B")
        with pytest.raises(BackendError, match="model directory not found"):
            SGLangBackend("http://127.0.0.1:1", str(tmp_path / "nowhere" / "x" / "y"))
    finally:
        monkeypatch.undo()
        importlib.reload(c)


def test_the_http_backend_renders_without_importing_torch(tiny_model_dir):
    """An HTTP-path probe or runner only renders prompts: the tokenizer class its config names is loaded
    directly (AutoTokenizer would import torch: +0.5 GB per process), and it is the class AutoTokenizer picks,
    rendering identically."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import sys; from agent.backends import make_backend; "
            f"b = make_backend('sglang', endpoint='http://127.0.0.1:9', model_dir={str(tiny_model_dir)!r}); "
            "print(type(b.tok).__name__, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert r.returncode == 0 and r.stdout.split() == ["Qwen3_5Tokenizer", "False"], r.stderr[-2000:]
    from transformers import AutoTokenizer

    from agent.backends.local import _fingerprint, _named_tokenizer

    direct = _named_tokenizer(tiny_model_dir)
    assert type(direct) is type(AutoTokenizer.from_pretrained(tiny_model_dir))
    assert _fingerprint(direct) == _fingerprint(AutoTokenizer.from_pretrained(tiny_model_dir))


def test_prompt_ids_per_message_equal_the_whole_prompts_ids(tiny_model_dir, red_image):
    """The native backend tokenises a rendered prompt message by message (cut before each <|im_start|>) and
    remembers each piece: the ids must be exactly those of the whole text, for the shapes a trajectory takes
    (images, reasoning in the history, tool responses, text that looks like a special token, non-ASCII)."""
    from agent.backends import make_backend

    b = make_backend("sglang", endpoint="http://127.0.0.1:9", model_dir=str(tiny_model_dir))
    img = {"type": "image_url", "image_url": {"url": str(red_image)}}
    history = [{"role": "system", "content": "You answer questions about images."},
               {"role": "user", "content": [{"type": "text", "text": "<image_0>"}, img,
                                            {"type": "text", "text": "Which year? naïve café — 東京 <|im_start|> x"}]}]
    for i in range(4):
        history += [{"role": "assistant", "content": f'<tool_call>\n{{"name": "search", "arguments": {{"query": "q{i}"}}}}\n</tool_call>',
                     "reasoning_content": f"step {i}: look again\n\n at the  image"},
                    {"role": "user", "content": f"<tool_response>\nresult {i}: 1911 ... \n</tool_response>"}]
        for msgs in (history, [m if m["role"] != "user" or not isinstance(m["content"], list)
                               else {**m, "content": [p for p in m["content"] if p.get("type") == "text"]}
                               for m in history]):
            prompt, _ = b.render(msgs, {"enable_thinking": True})
            assert b.prompt_ids(prompt).tolist() == b.tok(prompt, add_special_tokens=False)["input_ids"]
    assert len(b._piece_ids) >= 6  # the pieces were remembered and reused


async def test_a_read_reply_and_its_request_body_are_freed_without_the_cyclic_collector(native, red_image, fake_sglang):
    """Neither client leaves a reply or a request in a reference cycle (httpx binds each response's stream back to
    the response, encode/httpx#3733; the tools' pool breaks it): unbroken, every reply and its request body (the
    images) would wait for a full collection, and memory would grow with the steps in flight."""
    import gc

    import aiohttp

    from agent.http import Reply, make_client, request_json

    tools = make_client()
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            await native.generate(msgs(red_image), SamplingParams(max_tokens=16))
            await request_json(tools, "POST", fake_sglang.url + "/generate", json_body={"text": "x"}, policy=FAST)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        kinds = (httpx.Response, httpx.Request, aiohttp.ClientResponse, aiohttp.ClientRequest, Reply)
        cyclic = [type(o).__name__ for o in gc.garbage if isinstance(o, kinds)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        await tools.aclose()
    assert cyclic == []


async def test_an_image_request_body_is_written_from_the_image_as_it_is_sent(native, fake_sglang, tmp_path):
    """The data URI of a photo-sized image is never built whole on the client (neither cached nor inside a whole
    body): the body goes out in pieces with its length given (no chunked encoding), and the server reads exactly the
    bytes a whole serialisation would have been."""
    import numpy as np
    from PIL import Image

    from agent import images as I
    from agent.jsonio import dumps

    p = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 300, 3), dtype=np.uint8)).save(p)
    I.forget_images([I.load_image(str(p)).sha256])
    uris = I.image_cache_stats()["uri_bytes"]
    sent: list = []
    real = ModelClient.request

    async def spy(self, method, url, **kw):  # what the client is handed: a stream and its length, not a whole body
        sent.append((kw.get("content"), dict(kw.get("headers") or {})))
        return await real(self, method, url, **kw)
    ModelClient.request = spy
    try:
        await native.generate(msgs(p), SamplingParams(max_tokens=8))
    finally:
        ModelClient.request = real
    content, headers = sent[-1]
    assert not isinstance(content, (bytes, str)) and "Transfer-Encoding" not in headers
    assert I.image_cache_stats()["uri_bytes"] == uris  # no data URI was built to send it
    length, chunked = fake_sglang.framing[-1]  # as the server read it: a plain body of the length given
    assert chunked is None and int(length) == int(headers["Content-Length"])
    body = fake_sglang.bodies[-1]
    assert body["image_data"] == [I.load_image(str(p)).data_uri()]
    assert int(headers["Content-Length"]) == len(dumps(body)) > 300 * 300


async def test_a_photo_is_read_from_its_file_as_it_is_sent_and_a_changed_file_is_refused_before_it_goes_out_whole(
        native, fake_sglang, tmp_path):
    """A file's image holds no bytes between the requests that send it; they are read and hashed as they are sent.
    A file changed since it was hashed, even one that keeps its size and time (the cache's identity), is refused
    naming it before its last byte is sent: the server never answers for bytes its recorded sha256 does not name."""
    import os

    from PIL import Image

    from agent import images as I

    p = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (200, 200, 3), dtype=np.uint8)).save(p)
    img = I.load_image(str(p))
    assert img.content is None and img.data == p.read_bytes()
    await native.generate(msgs(p), SamplingParams(max_tokens=8))
    assert fake_sglang.bodies[-1]["image_data"] == [img.data_uri()]
    sent = len(fake_sglang.bodies)
    st = os.stat(p)
    with open(p, "r+b") as f:  # other bytes, the same size and modification time
        f.seek(st.st_size // 2)
        f.write(bytes(64))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert I.load_image(str(p)) is img  # the cache still takes it for the file it hashed
    with pytest.raises(I.ImageError, match="changed after it was read and hashed"):
        await native.generate(msgs(p), SamplingParams(max_tokens=8))
    assert len(fake_sglang.bodies) == sent  # nothing reached the server whole, nothing was asked again
    with pytest.raises(I.ImageError, match="changed after it was read"):
        img.data


def test_token_ids_are_written_as_sent_from_the_arrays_that_hold_them_with_their_exact_length():
    """A request's token ids (a prompt's pieces, then a continuation) are written piece by piece as the body is sent:
    the same bytes and length as the whole array's JSON, across chunk boundaries, empty pieces and any number."""
    import orjson

    from agent.backends.prompt_tokens import JsonIds, json_len
    from agent.http import _content
    from agent.jsonio import dumps, dumps_parts

    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 248_320, n).astype(np.int32) for n in (0, 1, 9, JsonIds.CHUNK + 5, 0, 3)]
    arrays.append(np.array([0, 9, 10, 99, 100, 2**31 - 1, -1, -12], dtype=np.int32))  # every digit count, a sign
    whole = np.concatenate(arrays)
    want = orjson.dumps(whole, option=orjson.OPT_SERIALIZE_NUMPY)
    ids = JsonIds(arrays)
    assert all(json_len(a) == len(orjson.dumps(a, option=orjson.OPT_SERIALIZE_NUMPY)) - 2 for a in arrays)
    assert ids.whole() == want and ids.nbytes() == len(want) and len(ids) == len(whole)
    assert JsonIds([]).whole() == b"[]" == dumps([]) and JsonIds([]).nbytes() == 2
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}
    plain = dumps({**body, "input_ids": whole})
    assert dumps(body) == plain  # written whole where a whole body is wanted
    pieces = dumps_parts(body)
    assert any(p is ids for p in pieces)  # left for the sender, not written into the body's bytes
    stream, headers = _content(pieces)
    assert int(headers["Content-Length"]) == len(plain)

    async def drain():
        return b"".join([part async for part in stream])
    assert asyncio.run(drain()) == plain


async def test_a_scoring_request_sends_its_token_ids_as_a_stream_and_the_server_reads_them_exactly(native, fake_sglang):
    """No joined array and no body text of a prompt's ids is held while its request is in flight: the client is
    handed a stream of the length given, and the server reads the very ids a whole body would have carried."""
    sent: list = []
    real = ModelClient.request

    async def spy(self, method, url, **kw):
        sent.append((kw.get("content"), dict(kw.get("headers") or {})))
        return await real(self, method, url, **kw)
    messages = [{"role": "user", "content": "What colour is it? " * 40}]
    cont = Continuation(ids=native.tok("It is red.", add_special_tokens=False)["input_ids"])
    ModelClient.request = spy
    try:
        await native.score(messages, cont)
    finally:
        ModelClient.request = real
    content, headers = sent[-1]
    assert not isinstance(content, (bytes, str)) and "Transfer-Encoding" not in headers
    length, chunked = fake_sglang.framing[-1]
    assert chunked is None and int(length) == int(headers["Content-Length"])
    prompt, _ = native.render(messages, {"enable_thinking": True})
    want = native.tok(prompt, add_special_tokens=False)["input_ids"] + list(cont.ids)
    assert fake_sglang.bodies[-1]["input_ids"] == want


@pytest.mark.slow
async def test_a_hung_server_is_found_by_its_health_while_a_request_waits_not_at_the_request_timeout(tiny_model_dir):
    """A hung scheduler (no reply, /health 503) ends a request at the next liveness check, well before its own
    600 s timeout; a slow server whose /health answers keeps its requests waiting until they are answered."""
    import time

    from agent.backends.base import ModelServerDown
    from agent.http import RetryPolicy
    from serving.fakes.sglang_server import FakeSGLang

    watch = RetryPolicy(retries=0, timeout_s=600, liveness_every_s=0.5)
    with FakeSGLang(tokenizer_dir=str(tiny_model_dir), model_name=str(tiny_model_dir), latency_s=1.5) as srv:
        slow = SGLangBackend(srv.url, str(tiny_model_dir), policy=watch)
        outs = await asyncio.gather(*[slow.generate([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4))
                                      for _ in range(6)])
        assert len(outs) == 6  # three watch periods each, answered: a slow server is not a dead one
        srv.hung.set()
        hung = SGLangBackend(srv.url, str(tiny_model_dir), policy=watch)
        t0 = time.monotonic()
        with pytest.raises(ModelServerDown, match="down or hung"):
            await asyncio.gather(*[hung.generate([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4))
                                   for _ in range(4)])
        assert time.monotonic() - t0 < 300  # a guard against the old wait (600 s), not a verdict on speed
