"""mmcf-toolkit agents: model backends, retrieval tools, benchmarks, agents, runner and judge."""
__version__ = "0.1.0"
