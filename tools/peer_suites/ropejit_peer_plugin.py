"""pytest plugin of the peer suites (run.py loads it with -p): before the peer's test module is
imported, puts ropejit.dropin's functions where the peer's kernel entry points were, and writes
each test's outcome to the JSON file ROPEJIT_PEER_RESULTS names."""

import importlib
import inspect
import json
import os
import re
import sys

import pytest

# Per suite: the peer's package, then (peer module, name, drop-in module, only when) for each
# entry point; the drop-in has the peer's name. "only when" names a boolean argument: calls
# without it set keep the peer's function (TE's suite takes its reference from fused=False).
# vLLM's seam is a module, vllm/_custom_ops.py among the shims.
SWAPS = {
    "te": ("transformer_engine", [
        ("transformer_engine.pytorch.attention.rope", "apply_rotary_pos_emb",
         "ropejit.dropin.transformer_engine", "fused"),
        ("transformer_engine.pytorch.attention.rope", "apply_fused_qkv_rotary_pos_emb",
         "ropejit.dropin.transformer_engine", None),
    ]),
    "flash": ("flash_attn", [
        ("flash_attn.layers.rotary", "apply_rotary_emb", "ropejit.dropin.flash_attn", None),
        ("flash_attn.layers.rotary", "apply_rotary_emb_qkv_", "ropejit.dropin.flash_attn", None),
        ("flash_attn.layers.rotary", "apply_rotary_emb_kv_", "ropejit.dropin.flash_attn", None),
    ]),
    "liger": ("liger_kernel", [
        ("liger_kernel.ops.rope", "LigerRopeFunction", "ropejit.dropin.liger", None),
        ("liger_kernel.transformers.functional", "liger_rope", "ropejit.dropin.liger", None),
        ("liger_kernel.transformers.rope", "liger_rotary_pos_emb", "ropejit.dropin.liger", None),
    ]),
    "vllm": ("vllm", []),
}

_suite = os.environ.get("ROPEJIT_PEER_SUITE", "")
_header = []
_results = {"collected": 0, "collect_errors": [], "tests": {}}


def _dropin(module, name):
    found = getattr(importlib.import_module(module), name, None)
    if found is not None:
        return found

    def missing(*args, **kwargs):
        raise NotImplementedError(f"{module} has no {name}")
    return missing


def _only_when(argument, peer, dropin):
    signature = inspect.signature(peer)

    def either(*args, **kwargs):
        chosen = signature.bind(*args, **kwargs).arguments.get(argument, False)
        return (dropin if chosen else peer)(*args, **kwargs)
    return either


def _replace(package, original, replacement):
    """Every reference to `original` in the peer's loaded modules (its own and the re-exports);
    returns how many."""
    places = 0
    for name, module in list(sys.modules.items()):
        if module is None or (name != package and not name.startswith(package + ".")):
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                setattr(module, attribute, replacement)
                places += 1
    return places


def pytest_configure(config):
    if config.option.collectonly:
        import torch
        if not torch.cuda.is_available():
            # flash-attn's test reads the device's capability at import; listing needs no device.
            torch.cuda.get_device_capability = lambda device=None: (9, 0)
    package, swaps = SWAPS[_suite]
    for module, name, dropin_module, only_when in swaps:
        original = getattr(importlib.import_module(module), name)
        replacement = _dropin(dropin_module, name)
        if only_when:
            replacement = _only_when(only_when, original, replacement)
        places = _replace(package, original, replacement)
        when = f" when {only_when}" if only_when else ""
        _header.append(f"ropejit swap: {module}.{name} -> {dropin_module}.{name}{when} "
                       f"({places} references)")


def pytest_report_header(config):
    return _header


@pytest.fixture
def default_vllm_config():
    """vLLM's tests/conftest.py fixture; the shims' CustomOp reads no config."""
    yield None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.excinfo is not None:
        lines = [e.lineno + 1 for e in call.excinfo.traceback if str(e.path) == str(item.path)]
        report.test_line = f"{item.path.name}:{lines[-1]}" if lines else None


def _reason(report):
    """The test's line that failed, the raising file's line when elsewhere, and the first line of
    the message; object addresses dropped so that equal reasons group."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is None:
        return str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
    where = f"{os.path.basename(crash.path)}:{crash.lineno}"
    test_line = getattr(report, "test_line", None)
    if test_line and test_line != where:
        where = f"{test_line} -> {where}"
    lines = crash.message.strip().splitlines()
    return re.sub(r"0x[0-9a-f]+", "0x..", f"{where}: {lines[0] if lines else ''}")[:300]


def pytest_collection_finish(session):
    _results["collected"] = len(session.items)


def pytest_collectreport(report):
    if report.failed:
        _results["collect_errors"].append({"nodeid": report.nodeid, "reason": _reason(report)})


def pytest_runtest_logreport(report):
    # One outcome per test: its call's, or that of the setup that skipped or broke it, or "error"
    # for a teardown that broke after a pass.
    if report.when != "call" and report.passed:
        return
    earlier = _results["tests"].get(report.nodeid)
    if earlier is not None and earlier["outcome"] != "passed":
        return
    outcome = report.outcome if report.when == "call" or report.skipped else "error"
    _results["tests"][report.nodeid] = {
        "outcome": outcome, "reason": "" if report.passed else _reason(report)}


def pytest_sessionfinish(session):
    path = os.environ.get("ROPEJIT_PEER_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump({"header": _header, **_results}, f)
