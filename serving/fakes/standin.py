"""SGLang's own HTTP server on a CPU machine, with a stand-in for its scheduler (issue 21).

    python -m serving.fakes.standin --model-path .cache/tiny-qwen35 --port 30000 [--mode model|scripted]

Everything in front of the scheduler is SGLang's (0.5.23): FastAPI routing and request validation, the OpenAI
chat layer (the model's chat template, image decoding, ``reasoning_content`` via the qwen3 parser, OpenAI
logprobs), the TokenizerManager with the Qwen-VL multimodal processor (image token expansion,
``image_grid_thw``), the DetokenizerManager, ``meta_info`` and logprob formatting. Only the scheduler process
is ours: :func:`run_standin_scheduler` is handed to ``launch_server(server_args,
run_scheduler_process_func=...)`` (a public argument), receives the ``TokenizedGenerateReqInput`` the
TokenizerManager sends over ZMQ, and streams ``BatchTokenIDOutput`` to the DetokenizerManager, as
``Scheduler`` does.

Modes: ``model`` (default) computes every token and its top-k logprobs with the embedded tiny Qwen3.5 in
transformers (the request's pixel values and ``image_grid_thw`` go into the forward, so images change the
distribution; a KV cache per request); ``scripted`` answers with planted texts (``--reply``, or
``MMCF_STANDIN_REPLY``) with planted distributions, so agents act and the reasoning split is exercised fast.

What this proves: the toolkit's requests are valid for SGLang's real front end and its replies are what that
front end makes of a scheduler's output. What it does not: kernels, batching, the radix cache, the real
model's numbers (docs/serving.md, "SGLang's real front end on CPU").
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from array import array

from .standin_engines import DEFAULT_REPLY, ModelEngine, ScriptedEngine, eos_ids

log = logging.getLogger(__name__)

__all__ = ["run_standin_scheduler", "main", "SGLANG_VERSION"]

#: The one SGLang version this seam is written against (its io_struct fields and socket layout).
SGLANG_VERSION = "0.5.23"
_READY_TOKENS = 1 << 20
#: SGLang's own constant (managers/schedule_batch.py): ids of the prompt kept before the output for
#: incremental detokenization.
_DETOK_SURR = 5


# ====================================================================== the scheduler process
def run_standin_scheduler(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer):
    """The process SGLang starts in place of its scheduler (same signature as ``run_scheduler_process``)."""
    try:
        sched = _Standin(server_args, port_args)
    except Exception as e:  # noqa: BLE001 - say why, then let SGLang report the failed start
        import traceback

        traceback.print_exc()
        pipe_writer.send({"status": f"stand-in scheduler failed to start: {type(e).__name__}: {e}"})
        return
    pipe_writer.send({"status": "ready", "max_total_num_tokens": _READY_TOKENS,
                      "max_req_input_len": _READY_TOKENS - 1024, "startup_time": None})
    sched.loop()


class _Standin:
    def __init__(self, server_args, port_args):
        import zmq
        from sglang.srt.utils.network import get_zmq_socket

        self.args = server_args
        self.mode = os.environ.get("MMCF_STANDIN_MODE", "model")
        self.reply = os.environ.get("MMCF_STANDIN_REPLY", DEFAULT_REPLY)
        ctx = zmq.Context(2)
        self.recv = get_zmq_socket(ctx, zmq.PULL, port_args.scheduler_input_ipc_name, False)
        self.to_tokenizer = get_zmq_socket(ctx, zmq.PUSH, port_args.tokenizer_ipc_name, False)
        self.to_detok = get_zmq_socket(ctx, zmq.PUSH, port_args.detokenizer_ipc_name, False)
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(server_args.tokenizer_path or server_args.model_path)
        self.engines = {}
        if self.mode in ("model", "both"):
            self.engines["model"] = ModelEngine(server_args.model_path)
        if self.mode in ("scripted", "both"):
            self.engines["scripted"] = ScriptedEngine(self.tok)
        # --mode both: each request is served by the engine the --mode-file names (scripted while it is absent), so
        # one front end serves requests of both kinds (an SGLang front end is slow to start)
        self.mode_file = os.environ.get("MMCF_STANDIN_MODE_FILE")
        self.aborted: set = set()
        self.queue: list = []  # generation requests in arrival order (served one at a time: no batching)
        self.abort_all = False
        # --leak-file: while the file exists, a scoring request whose prompt was
        # scored since the last /flush_cache comes back with its logprobs shifted by the file's value (a prefix
        # cache reusing another request's state: the fault probes/fidelity/ exists to catch)
        self.leak_file = os.environ.get("MMCF_STANDIN_LEAK_FILE")
        self.seen: set = set()
        # SGLang reads SGLANG_RETURN_ORIGINAL_LOGPROB once at start (srt/layers/sampler.py, get_bool_env_var);
        # --original-logprob-file switches a running stand-in, so one front end serves a test both ways
        self.original = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "false").lower() in ("true", "1")
        self.original_file = os.environ.get("MMCF_STANDIN_ORIGINAL_FILE")

    def _mode(self) -> str:
        if self.mode != "both":
            return self.mode
        try:
            want = open(self.mode_file).read().strip() if self.mode_file else ""
        except OSError:
            want = ""
        return want if want in self.engines else "scripted"

    def _engine(self):
        return self.engines[self._mode()]

    def _original(self) -> bool:
        if not self.original_file:
            return self.original
        try:
            return open(self.original_file).read().strip() in ("1", "true")
        except OSError:
            return self.original

    def _leak(self) -> float:
        if not self.leak_file:
            return 0.0
        try:
            return float(open(self.leak_file).read().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def _drain(self) -> None:
        """Take every message waiting on the socket: generation requests join the queue, aborts are noted,
        control requests are answered; never blocks."""
        import zmq
        from sglang.srt.managers import io_struct as io

        while True:
            try:
                obj = io.sock_recv(self.recv, zmq.NOBLOCK)
            except zmq.Again:
                return
            reqs = obj.batch if isinstance(obj, io.BatchTokenizedGenerateReqInput) else [obj]
            for r in reqs:
                if isinstance(r, io.TokenizedGenerateReqInput):
                    self.queue.append(r)
                elif isinstance(r, io.AbortReq):
                    if r.abort_all:
                        self.aborted.update(q.rid for q in self.queue)
                        self.abort_all = True
                    elif r.rid:
                        self.aborted.add(r.rid)
                else:
                    self._control(r)

    def loop(self):
        import zmq

        poller = zmq.Poller()
        poller.register(self.recv, zmq.POLLIN)
        queue = self.queue
        while True:
            if not queue:
                poller.poll()
            self._drain()
            if queue:
                req = queue.pop(0)
                try:
                    self._serve(req)
                except Exception as e:  # noqa: BLE001 - one request fails, with SGLang's own abort reply
                    import traceback

                    traceback.print_exc()
                    self._finish_error(req, f"stand-in scheduler: {type(e).__name__}: {e}")

    # -------------------------------------------------------------- control requests
    def _control(self, r):
        from sglang.srt.managers import io_struct as io

        name = type(r).__name__
        if name == "GetInternalStateReq":
            io.sock_send(self.to_tokenizer, io.GetInternalStateReqOutput(
                internal_state={"standin_scheduler": True, "mode": self._mode(), "last_gen_throughput": 0.0,
                                "memory_usage": {}, "avg_spec_accept_length": None}))
        elif name == "GetLoadReqInput":
            io.sock_send(self.to_tokenizer, io.GetLoadReqOutput(dp_rank=0, num_reqs=0, num_waiting_reqs=0,
                                                                num_tokens=0))
        elif name == "FlushCacheReqInput":
            self.seen.clear()
            io.sock_send(self.to_tokenizer, io.FlushCacheReqOutput(success=True))
        # everything else (FreezeGCReq, profiling, weights, sessions …) needs no reply here

    # -------------------------------------------------------------- generation
    def _serve(self, req):
        sp = req.sampling_params
        ids = list(req.input_ids)
        if req.rid in self.aborted:
            self.aborted.discard(req.rid)
            return self._send(req, ids, None, {"type": "abort", "message": "aborted"})
        max_new = sp.max_new_tokens if sp.max_new_tokens is not None else 128
        k = int(req.top_logprobs_num or 0)
        # as Scheduler.handle_generate_request: -1 with return_logprob = output logprobs only; a start past the
        # prompt is refused with SGLang's own message
        start = int(req.logprob_start_len)
        if not req.return_logprob or start == -1:
            start = len(ids)
        if start > len(ids):
            return self._finish_error(req, f"req.logprob_start_len={start} is higher than the number of input tokens "
                                           f"len(req.origin_input_ids)={len(ids)}. Please use a smaller logprob_start_len.")
        stops = set(sp.stop_token_ids or ()) | set(eos_ids(self.tok))
        gen = self._engine().start(ids, req.mm_inputs, sp, k, want_input=req.return_logprob and start < len(ids),
                                   input_from=start, original_logprobs=self._original())
        leak = self._leak() if gen.input_logprobs is not None else 0.0
        if leak:
            key = (tuple(ids), start, len(getattr(req.mm_inputs, "mm_items", None) or ()) if req.mm_inputs else 0)
            if key in self.seen:
                iv, ii, tv, ti = gen.input_logprobs
                gen.input_logprobs = ([v if v is None else v - leak for v in iv], ii,
                                      [t if t is None else [v - leak for v in t] for t in tv], ti)
            self.seen.add(key)
        state = _new_state(gen.input_logprobs if req.return_logprob else None)
        finish = None
        for step in range(max_new):
            if step and self._poll_abort(req.rid):
                finish = {"type": "abort", "message": "aborted"}
                break
            tid, lp, tv, ti = gen.next_token()
            state["out"].append(tid)
            state["lp"].append(lp)
            state["top_v"].append(tv)
            state["top_i"].append(ti)
            if tid in stops and not sp.ignore_eos:
                finish = {"type": "stop", "matched": int(tid)}
            elif len(state["out"]) >= max_new:
                finish = {"type": "length", "length": len(state["out"])}
            if finish is not None:
                break
            if req.stream:
                self._send(req, ids, state, None)
        if finish is None:
            finish = {"type": "length", "length": len(state["out"])}
        self._send(req, ids, state, finish)

    def _poll_abort(self, rid) -> bool:
        """Between two tokens: take what arrived (new requests queue up behind this one) and say whether this
        request was aborted (the client went away, or an abort-all)."""
        self.abort_all = False
        self._drain()
        if self.abort_all or rid in self.aborted:
            self.aborted.discard(rid)
            return True
        return False

    def _send(self, req, ids, state, finish):
        from sglang.srt.managers import io_struct as io

        if not state:
            state = _new_state()
        out = state["out"]
        surr = max(len(ids) - _DETOK_SURR, 0)
        decode_all = ids[surr:] + out
        decode_ids = decode_all[state["dsent"]:]
        read_offset = len(ids) - surr
        state["dsent"] = len(decode_all)
        new_out = out[state["sent"]:]
        state["sent"] = len(out)
        lp_from, lp_to = state["lpsent"], max(len(out), 1) if out else 0
        state["lpsent"] = lp_to
        if req.return_logprob and state.get("input") is not None and not state["input_sent"]:
            iv, ii, tv, ti = state["input"]
            state["input_sent"] = True
        else:
            iv, ii, tv, ti = [], [], [], []
        sp = req.sampling_params
        empty = [[]]
        payload = io.BatchTokenIDOutput(
            rids=[req.rid], http_worker_ipcs=[req.http_worker_ipc],
            finished_reasons=[finish], decoded_texts=[""], decode_ids=[_arr(decode_ids)],
            read_offsets=[read_offset], output_ids=[_arr(new_out)],
            skip_special_tokens=[sp.skip_special_tokens], spaces_between_special_tokens=[sp.spaces_between_special_tokens],
            no_stop_trim=[sp.no_stop_trim], prompt_tokens=[len(ids)], reasoning_tokens=[0],
            completion_tokens=[len(out)], cached_tokens=[0],
            input_token_logprobs_val=[iv] if req.return_logprob else None,
            input_token_logprobs_idx=[ii] if req.return_logprob else None,
            output_token_logprobs_val=[state["lp"][lp_from:lp_to]] if req.return_logprob else None,
            output_token_logprobs_idx=[out[lp_from:lp_to]] if req.return_logprob else None,
            input_top_logprobs_val=[tv] if req.return_logprob else None,
            input_top_logprobs_idx=[ti] if req.return_logprob else None,
            output_top_logprobs_val=[state["top_v"][lp_from:lp_to]] if req.return_logprob else None,
            output_top_logprobs_idx=[state["top_i"][lp_from:lp_to]] if req.return_logprob else None,
            input_token_ids_logprobs_val=empty if req.return_logprob else None,
            input_token_ids_logprobs_idx=empty if req.return_logprob else None,
            output_token_ids_logprobs_val=empty if req.return_logprob else None,
            output_token_ids_logprobs_idx=empty if req.return_logprob else None,
            output_token_entropy_val=None, output_token_sampling_mask=None, output_hidden_states=None,
            routed_experts=None, indexer_topk=None, placeholder_tokens_idx=None, placeholder_tokens_val=None,
            retraction_counts=[0], image_tokens=[0], audio_tokens=[0], video_tokens=[0],
            cached_tokens_details=[None], dp_ranks=[0],
        )
        io.sock_send(self.to_detok, payload)

    def _finish_error(self, req, message: str):
        self._send(req, list(req.input_ids or []), None,
                   {"type": "abort", "message": message, "status_code": 400, "err_type": "BadRequest"})


def _new_state(input_logprobs=None) -> dict:
    """One request's streaming state: its output so far and how much of it (and of its logprobs) was sent."""
    return {"out": [], "lp": [], "top_v": [], "top_i": [], "sent": 0, "dsent": 0, "lpsent": 0,
            "input": input_logprobs, "input_sent": input_logprobs is None}


def _arr(xs):
    return array("q", [int(x) for x in xs])


# ====================================================================== the command
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m serving.fakes.standin", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  python -m serving.fakes.standin --model-path .cache/tiny-qwen35 --port 30000\n"
                                        "  python -m serving.fakes.standin --model-path .cache/tiny-qwen35 --mode scripted "
                                        "--reply 'ok</think>\\n\\n<answer>1911</answer>'")
    ap.add_argument("--model-path", required=True, help="the tiny model's directory (tokenizer, chat template, weights)")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--nccl-port", type=int, help="the NCCL / dist-init port SGLang reserves (the launcher gives each "
                                                  "server its own)")
    ap.add_argument("--mode", choices=("model", "scripted", "both"), default="model",
                    help="both: either engine per request, as the file --mode-file names (scripted while it is absent)")
    ap.add_argument("--mode-file", metavar="PATH", help="with --mode both: the file naming the engine of the next "
                                                        "requests (model or scripted)")
    ap.add_argument("--leak-file", metavar="PATH",
                    help="while this file exists, a scoring request whose prompt was scored since the last "
                         "/flush_cache comes back with its logprobs shifted by the file's number (a prefix cache "
                         "leaking state: the fault probes/fidelity/ must catch)")
    ap.add_argument("--original-logprob-file", metavar="PATH",
                    help="while this file holds 1, output logprobs are raw, as under SGLANG_RETURN_ORIGINAL_LOGPROB=1 "
                         "(which the stand-in also honours at start); lets one front end serve a test both ways")
    ap.add_argument("--context-length", type=int,
                    help="override the model's context length (the tiny model's is 32,768; a paper-shaped prompt with "
                         "photos, in the tiny tokenizer's ~3x tokens, is longer); sets "
                         "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 as SGLang asks")
    ap.add_argument("--reply", help="scripted mode: the planted reply text")
    ap.add_argument("--policy", metavar="MODULE:FUNCTION",
                    help="scripted mode: a function of {'messages': prompt text} returning the reply (e.g. "
                         "serving.fakes.policy:agent_policy, which makes the agents act)")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    os.environ["MMCF_STANDIN_MODE"] = a.mode
    if a.reply is not None:
        os.environ["MMCF_STANDIN_REPLY"] = a.reply
    if a.policy:
        os.environ["MMCF_STANDIN_POLICY"] = a.policy
    for var, path in (("MMCF_STANDIN_MODE_FILE", a.mode_file), ("MMCF_STANDIN_LEAK_FILE", a.leak_file),
                      ("MMCF_STANDIN_ORIGINAL_FILE", a.original_logprob_file)):
        if path:  # read by the scheduler process SGLang starts (its arguments are SGLang's, not ours)
            os.environ[var] = path
    try:
        from sglang.srt.entrypoints.http_server import launch_server
        from sglang.srt.server_args import ServerArgs
    except ImportError as e:
        log.error(f"error: SGLang's front end is not importable ({e}); build it with bash scripts/sglang_conformance.sh "
                  "--front-end and put .venv-sglang/site and .venv-sglang/front on PYTHONPATH")
        return 2
    extra = {}
    if a.context_length:
        os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
        extra["context_length"] = a.context_length
    sa = ServerArgs(model_path=a.model_path, host=a.host, port=a.port, device="cpu", disable_radix_cache=True, **extra,
                    reasoning_parser="qwen3", served_model_name=a.served_model_name or os.path.basename(a.model_path.rstrip("/")),
                    skip_server_warmup=True, **({"nccl_port": a.nccl_port} if a.nccl_port else {}))
    launch_server(sa, run_scheduler_process_func=run_standin_scheduler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
