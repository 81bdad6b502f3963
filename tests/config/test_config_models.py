"""models: GGUF models besides the reference one, and serve.model picking one of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocky_vulkan.config import ConfigError, load_config

from tests.helpers.models import model, write_config
from tests.helpers.project import ROOT


def test_the_committed_config_serves_the_reference_model():
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    assert cfg.models == () and cfg.serve.model == "reference"
    assert cfg.served_model is None and cfg.served_filename == cfg.model.filename


def test_a_config_without_models_loads(tmp_path):
    path = write_config(tmp_path, [])
    path.write_text(path.read_text().replace("\nmodels: []\n", "\n", 1))
    assert load_config(path).models == ()


def test_serve_model_picks_an_entry_of_models(tmp_path):
    other = model(name="other", filename="other.gguf", sha256=None, license_flags="")
    cfg = load_config(write_config(tmp_path, [model(), other], serve="other"))
    assert [m.name for m in cfg.models] == ["tiny", "other"]
    assert cfg.served_model == cfg.models[1] and cfg.served_filename == "other.gguf"
    assert cfg.models[1].sha256 is None and cfg.models[1].license_flags == ""


def _refused(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    return message


def test_an_unknown_serve_model_is_refused_with_the_fix(tmp_path):
    message = _refused(write_config(tmp_path, [model()], serve="nope"))
    assert "serve.model: 'nope' is not a model of this config" in message
    assert "use reference (the model: section) or a models[].name (tiny)" in message
    assert "add an entry named 'nope' under models:" in message
    message = _refused(write_config(tmp_path / "none", [], serve="tiny"))
    assert "serve.model: 'tiny' is not a model" in message and "models[].name" not in message


def test_duplicate_names_and_the_name_reference_are_refused(tmp_path):
    twin = model(filename="twin.gguf")
    message = _refused(write_config(tmp_path, [model(), twin]))
    assert "models[1].name: 'tiny' is also models[0]'s name" in message
    message = _refused(write_config(tmp_path / "ref", [model(name="reference")]))
    assert "models[0].name: 'reference' is the model: section's name" in message


def test_each_model_needs_its_own_file_name(tmp_path):
    cfg = load_config(ROOT / "rocky-vulkan.yaml")
    message = _refused(write_config(tmp_path, [model(filename=cfg.model.filename)]))
    assert f"models[0].filename: '{cfg.model.filename}' is also model.filename" in message
    second = model(name="second")
    message = _refused(write_config(tmp_path / "two", [model(), second]))
    assert "models[1].filename: 'tiny-q8_0.gguf' is also models[0].filename" in message


@pytest.mark.parametrize(
    "key", ["name", "url", "filename", "sha256", "license", "license_flags", "homepage"]
)
def test_every_field_is_required(tmp_path, key):
    entry = model()
    del entry[key]
    message = _refused(write_config(tmp_path, [entry]))
    assert f"models[0]: '{key}' is a required property" in message


def test_unknown_fields_are_refused(tmp_path):
    message = _refused(write_config(tmp_path, [model(licence="MIT")]))
    assert "models[0]" in message and "'licence' was unexpected" in message


BAD_VALUES = [
    ("name", "Tiny", "lower-case name"),
    ("name", "tiny_1", "lower-case name"),
    ("name", "-tiny", "lower-case name"),
    ("url", "https://example.org/a b.gguf", "a URL starting with https://"),
    ("url", "https://example.org/m.gguf;name=x", "a URL starting with https://"),
    ("url", "https://example.org/${@os.system('id')}.gguf", "a URL starting with https://"),
    ("url", "ftp://example.org/m.gguf", "a URL starting with https://"),
    ("url", 'https://example.org/m.gguf"', "a URL starting with https://"),
    ("filename", "../../etc/passwd.gguf", "a file name ending in .gguf"),
    ("filename", "sub/m.gguf", "a file name ending in .gguf"),
    ("filename", "m.bin", "a file name ending in .gguf"),
    ("filename", ".hidden.gguf", "a file name ending in .gguf"),
    ("filename", "m.gguf\n", "a file name ending in .gguf"),
    ("sha256", "AB" * 32, "null (not pinned yet"),
    ("sha256", "ab" * 31, "null (not pinned yet"),
    ("sha256", "", "null (not pinned yet"),
    ("license", "MIT & Apache-2.0", "SPDX id"),
    ("license", "MIT|GPL-2.0", "SPDX id"),
    ("license", "GPL-2.0+", "SPDX id"),
    ("license", "", "SPDX id"),
    ("license_flags", "commercial_rocky-model-tiny", "one OE LICENSE_FLAGS word"),
    ("license_flags", "commercial extra", "one OE LICENSE_FLAGS word"),
    ("license_flags", "Commercial", "one OE LICENSE_FLAGS word"),
    ("license_flags", "${@'x'}", "one OE LICENSE_FLAGS word"),
    ("license_flags", None, "one OE LICENSE_FLAGS word"),
    ("homepage", "git://example.org/x", "https:// or http:// URL"),
    ("homepage", 'https://example.org/"x', "https:// or http:// URL"),
]


@pytest.mark.parametrize(("key", "value", "expected"), BAD_VALUES)
def test_hostile_values_are_refused_naming_the_field(tmp_path, key, value, expected):
    message = _refused(write_config(tmp_path, [model(**{key: value})]))
    assert f"models[0].{key}: expected" in message and expected in message


def test_sha256_may_be_null_until_fetched(tmp_path):
    assert load_config(write_config(tmp_path, [model(sha256=None)])).models[0].sha256 is None


def test_models_must_be_a_list(tmp_path):
    path = write_config(tmp_path, [])
    path.write_text(path.read_text().replace("\nmodels: []\n", "\nmodels: {tiny: {}}\n", 1))
    assert "models: expected a list of models" in _refused(path)


def test_a_draft_model_is_an_entry_with_a_licence_that_asks_for_nothing(tmp_path):
    small = model(name="small", filename="small.gguf", license="Apache-2.0", license_flags="")
    cfg = load_config(write_config(tmp_path, [model(), small], serve="tiny", draft="small"))
    assert cfg.serve.draft_model == "small" and cfg.draft == cfg.models[1]
    assert load_config(ROOT / "rocky-vulkan.yaml").draft is None


@pytest.mark.parametrize(
    ("draft", "serve", "expected"),
    [
        ("nope", "reference", "serve.draft_model: 'nope' is not an entry of models:"),
        ("reference", "reference", "serve.draft_model: 'reference' is not an entry of models:"),
        ("small", "small", "serve.draft_model: 'small' is the served model itself"),
        ("tiny", "reference", "has license_flags 'llama-community'"),
        ("Bad Name", "reference", "serve.draft_model"),
    ],
)
def test_a_wrong_draft_model_is_refused_with_the_fix(tmp_path, draft, serve, expected):
    small = model(name="small", filename="small.gguf", license="Apache-2.0", license_flags="")
    path = write_config(tmp_path, [model(), small], serve=serve, draft=f"'{draft}'")
    assert expected in _refused(path)
