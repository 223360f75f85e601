"""Every piece of the worker declares what it is (jev_worker/protocols.py), and nothing is found by duck typing:
no module of services/jev_worker uses getattr / hasattr as a plug point on the worker's own objects, every
registered family's readout subclasses protocols.Readout and names a Backend, and every class that is a
backend, engine, head, prompt builder or question type by what it does subclasses that protocol."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import jev_worker
from jev_worker import protocols
from jev_worker.backends.encoder import EncoderFiles
from jev_worker.backends.registry import BACKENDS, build_backend
from jev_worker.families.registry import FAMILIES, build_readout, family_class
from jev_worker.readouts.code_readout import CodeReadout
from jev_worker.readouts.standard import ExternalReadout

WORKER = Path(jev_worker.__file__).resolve().parent
# getattr / hasattr whose object is one of ours: the worker itself, a readout, backend, builder, head, engine,
# the serving, a recipe, a loaded model record, a question context or plan (third-party objects such as
# tokenizers, processors and HF configs are read with getattr where their versions differ; that is fine)
PLUG_POINT = re.compile(
    r"\b(?:getattr|hasattr)\(\s*(?:self|cls|readout|backend|builder|serving|head|engine|recipe|"
    r"loaded|ctx|plan|prepared|kind|service|settings)\b"
)
MODULES = sorted(
    name for _, name, _ in pkgutil.walk_packages([str(WORKER)], "jev_worker.") if not name.endswith("__main__")
)


def test_no_module_uses_getattr_or_hasattr_as_a_plug_point():
    found = []
    for path in sorted(WORKER.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PLUG_POINT.search(line):
                found.append(f"{path.relative_to(WORKER)}:{number}: {line.strip()}")
    assert not found, "getattr/hasattr plug points (declare the attribute or method instead):\n" + "\n".join(found)


def test_the_scan_finds_a_plug_point():
    assert PLUG_POINT.search('        load = getattr(self.serving.backend, "load_model", load_model)')
    assert PLUG_POINT.search('    wanted = getattr(readout, "backend", None)')
    assert PLUG_POINT.search('        if hasattr(self, "temperatures"):')
    assert not PLUG_POINT.search('    self._fast = bool(getattr(tokenizer, "is_fast", False))')


def test_backends_know_no_family():
    """A backend is built by the readout that needs it (with its file layout): none imports the family registry
    or a family's module."""
    for path in sorted((WORKER / "backends").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*from \.\.(families|readouts\.registry)\b", text, re.M), path.name


def _classes():
    for name in MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name:
                yield cls


def _has(cls, *methods: str) -> bool:
    return all(callable(inspect.getattr_static(cls, m, None)) for m in methods)


def test_what_acts_as_a_protocol_declares_it():
    """A class with a protocol's methods subclasses that protocol (abstract helpers included)."""
    undeclared = []
    for cls in _classes():
        wanted = []
        if _has(cls, "rows", "answer"):
            wanted.append(protocols.QuestionKind)
        if _has(cls, "prepare", "check_user_text"):
            wanted.append(protocols.PromptBuilder)
        if _has(cls, "logits"):
            wanted.append(protocols.Head)
        if _has(cls, "request_logits"):
            wanted.append(protocols.RequestHead)
        if _has(cls, "build") and "prefix_reuse" in dir(cls):
            wanted.append(protocols.Backend)
        if cls.__name__.endswith(("Engine", "Runner")) and _has(cls, "run"):
            wanted.append(protocols.Engine)
        if _has(cls, "positions", "prefix_inputs", "whole_mask"):
            wanted.append(protocols.ForwardAdapter)
        if _has(cls, "match", "insert", "resident"):
            wanted.append(protocols.PrefixCache)
        if _has(cls, "requirements", "load", "describe"):
            wanted.append(protocols.Readout)
        if _has(cls, "config", "tokenizer") and "needed" in dir(cls):
            wanted.append(EncoderFiles)
        undeclared += [
            f"{cls.__module__}.{cls.__qualname__} is not a {p.__name__}" for p in wanted if not issubclass(cls, p)
        ]
    assert not undeclared, "\n".join(undeclared)


def test_the_protocol_scan_sees_every_kind_of_piece():
    names = {cls.__qualname__ for cls in _classes()}
    for piece in (
        "ChatPromptBuilder",
        "LayaSequenceBuilder",
        "ValenPromptBuilder",
        "VelaBuilder",
        "MarkerSequenceBuilder",
        "DecisionHead",
        "ClefJointHead",
        "ModelRunner",
        "EncoderEngine",
        "TextAdapter",
        "Lfm2Adapter",
        "L3PrefixCache",
        "ValenLora",
        "VelaDecoder",
        "Choice",
        "CuaChoice",
        "MarkerSet",
        "ClmCosine",
        "VelaEncoderFiles",
    ):
        assert piece in names, piece


def _returns(function) -> type:
    """The class a function's return annotation names (resolved in its module)."""
    annotation = function.__annotations__["return"]
    return eval(annotation, function.__globals__) if isinstance(annotation, str) else annotation  # noqa: S307


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory) -> Path:
    from tools.tiny_checkpoints import make_tiny_code_readout

    return make_tiny_code_readout(tmp_path_factory.mktemp("code"), seed=3, codes=8)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_declares_its_readout_builder_and_backend(family, code_dir):
    cls = family_class(family)
    assert issubclass(cls, protocols.Readout) and not inspect.isabstract(cls), cls
    assert cls.__module__.startswith(("jev_worker.families.", "jev_worker.readouts.")), cls.__module__
    readout = build_readout(family, {})
    if isinstance(readout, CodeReadout):  # its backend follows the checkpoint's attention_mode, read by check
        readout.check(str(code_dir))
    backend = readout.make_backend()
    assert isinstance(backend, protocols.Backend), backend
    if isinstance(readout, ExternalReadout):
        assert isinstance(backend, protocols.ExternalBackend)
    else:
        engine = _returns(type(backend).build)
        assert issubclass(engine, protocols.Engine), (backend.name, engine)
    builder = _returns(cls.prompt_builder)
    assert issubclass(builder, protocols.PromptBuilder), (family, builder)


def test_every_family_folder_is_registered_and_the_backends_registry_is_generic():
    folders = {p.name for p in (WORKER / "families").iterdir() if (p / "__init__.py").is_file()}
    registered = {
        FAMILIES[name].split(":")[0].split(".")[2]
        for name in FAMILIES
        if FAMILIES[name].startswith("jev_worker.families.")
    }
    assert folders == registered, (sorted(folders), sorted(registered))
    for name, target in BACKENDS.items():
        assert target.startswith("jev_worker.backends."), (name, target)
        assert isinstance(build_backend(name), protocols.Backend), name
