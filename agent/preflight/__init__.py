"""Checks that run before any work: a number is right or refused (exit 2, one clear message).

    from agent.preflight import model_identity, require_keys, check_benchmark_images
    ident = await model_identity(backend)          # which model a backend really serves (asks the server)
    agent.identity.same_model(run.header.model.as_recorded(), ident)   # -> None, or why the two differ (no request)

What is checked, and by whom (docs/reliability.md):

- the model server answers and serves the model named (``/v1/models``; SGLang also ``/model_info``, else ``/get_model_info``,
  whose weights path must match ``--model-dir``); several ``--endpoint``s must serve one model;
- the benchmark's images exist, are readable and are images (``--allow-missing-images`` runs the rest);
- every API key a stage needs is set (search/visit/lens for live tools, the judge's, the annotator's),
  and live lens_search has a public-URL configuration;
- a probe queries the model that recorded the run (``--force`` overrides and is recorded).

:func:`model_identity` records ``{"backend", "served_model", "weights", "fingerprint"}``: the served
model id, the weights path the server loaded (or the local directory) and, for an in-process model, a
fingerprint of its config and weight files, so that a moved directory still matches and another model
never does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agent.lazy import lazy_exports

__all__ = ['PREFLIGHT_POLICY', 'PreflightError', 'check_benchmark_images', 'check_output_room', 'context_limit', 'main', 'model_identity', 'require_keys', 'server_facts']

# loaded when first read: ``python -m agent.preflight --help`` imports this package and needs none of the work
__getattr__, __dir__ = lazy_exports(__name__, {
    "PreflightError": ".checks",
    "model_identity": ".checks",
    "require_keys": ".checks",
    "check_benchmark_images": ".checks",
    "PREFLIGHT_POLICY": ".checks",
    "server_facts": ".checks",
    "context_limit": ".checks",
    "check_output_room": ".checks",
    "main": ".cli"})

if TYPE_CHECKING:
    from .checks import (
        PREFLIGHT_POLICY,
        PreflightError,
        check_benchmark_images,
        check_output_room,
        context_limit,
        model_identity,
        require_keys,
        server_facts,
    )
    from .cli import main
