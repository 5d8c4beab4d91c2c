"""Serving: SGLang launch scripts for the Qwen3.5 backbones and the ``serving.check`` smoke test."""
