"""The code keeps the shape docs/architecture.md describes: modules by concept (none over 600 lines, no private name
imported from another module), short functions (ast only)."""
from __future__ import annotations

import ast

from tests.conftest import REPO

PACKAGES = ("agent", "probes", "analysis", "serving", "scripts")
#: The paper's prompt texts, verbatim, are one module however long they are.
LONG_MODULE_ALLOWED = {"agent/prompts.py"}
MAX_MODULE, MAX_FUNCTION = 600, 80


def _sources():
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            yield p.relative_to(REPO).as_posix(), p.read_text(encoding="utf-8")


def test_no_module_over_600_lines():
    long = [(rel, src.count("\n")) for rel, src in _sources()
            if src.count("\n") > MAX_MODULE and rel not in LONG_MODULE_ALLOWED]
    assert not long, f"modules over {MAX_MODULE} lines (split by concept): {long}"


def test_no_private_name_is_imported_from_another_module():
    """A module that needs another's ``_private`` helper is one concept cut in two (merge them), or the helper is
    shared (make it public in the layer both use)."""
    crossing = []
    for rel, src in _sources():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in PACKAGES):
                crossing += [f"{rel}:{node.lineno} {a.name} from {node.module}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert not crossing, f"private names imported across modules: {crossing}"


def test_no_function_over_80_lines():
    long = []
    for rel, src in _sources():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION:
                    long.append(f"{rel}:{node.lineno} {node.name} ({n})")
    assert not long, f"functions over {MAX_FUNCTION} lines: {long}"


def test_the_architecture_page_names_every_package():
    doc = (REPO / "docs" / "architecture.md").read_text()
    for sub in ("agent/backends/", "agent/rundir/", "agent/run/", "agent/judge/", "agent/show/", "probes/entropy/",
                "analysis/figures/", "serving/plan.py"):
        assert sub in doc, sub
        assert (REPO / sub).exists(), sub


def test_tests_sharing_an_expensive_fixture_run_on_one_worker(request):
    """tests/conftest.py's unit_of keeps the tests of a module-scoped fixture, and every test of the SGLang oracle
    or SGLang's real front end (session fixtures, each ~10-40 s of CPU to start), on one worker: checked over the
    tests this session collected."""
    from tests.conftest import ONE_UNIT, unit_of

    items = request.session.items
    shared = {i.nodeid.split("::")[0] for i in items  # modules whose tests use a module-scoped fixture
              if any(d.scope == "module" for ds in i._fixtureinfo.name2fixturedefs.values() for d in ds)}
    checked = 0
    for item in items:
        module = item.nodeid.split("::")[0]
        if {"sglang", "_real_sglang_both"} & set(item.fixturenames):
            assert unit_of(item.nodeid) == "sglang", item.nodeid
            checked += 1
        elif module in ONE_UNIT:  # the other tests of those modules go with them
            assert unit_of(item.nodeid) == ONE_UNIT[module], item.nodeid
        elif module in shared:
            assert unit_of(item.nodeid) == module, item.nodeid
            checked += 1
        else:  # a module whose module-scoped fixture no test of this session uses (-m deselected them) may group
            assert unit_of(item.nodeid) in (item.nodeid, module), item.nodeid
    assert checked or len(request.session.items) < 100  # a whole-suite session has both kinds


def test_every_error_the_toolkit_raises_has_one_root():
    """Every exception class the packages define is a ToolkitError (a UsageError or a HarnessError), so a command
    catches one root; the model's own mistakes (a malformed action, an unparsable label) are observations, not
    toolkit errors, and are named here."""
    import importlib
    import inspect

    from agent.errors import HarnessError, ToolkitError, UsageError

    # (ReleaseCrash: what a model's output makes the authors' release raise, reproduced as its answer)
    model_mistakes = {"agent.parsing.ActionError", "probes.grounding.annotate.LabelError",
                      "agent.methods.mmcontextfold_release.ReleaseCrash"}
    stray = []
    for rel, _ in _sources():
        if rel.startswith(("scripts/", "serving/fakes/")) or rel.endswith("__main__.py"):
            continue  # scripts, and the fake servers (doubles: vllm_server.py needs vLLM's layer on the path)
        mod = importlib.import_module(rel[:-3].replace("/", ".").removesuffix(".__init__"))
        for name, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__ or not issubclass(cls, BaseException):
                continue
            if f"{mod.__name__}.{name}" in model_mistakes or cls is ToolkitError:
                continue
            if not issubclass(cls, (UsageError, HarnessError)) or not issubclass(cls, ToolkitError):
                stray.append(f"{mod.__name__}.{name}")
    assert not stray, f"exceptions outside agent.errors' root: {stray}"
